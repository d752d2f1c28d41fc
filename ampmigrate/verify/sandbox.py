"""Keep a verification run from writing into the user's project.

The runs execute the user's script with the user's working directory, so relative data paths
resolve as in a normal run; but a training script writes checkpoints and logs, often to relative
paths, and a 200-step verification run must not overwrite a real `checkpoint.pt`. In the child
process, writes under the protected folders (the project root, the working directory) go to a
scratch folder of that run instead, and later reads of a file the run wrote come back from
there, so save-then-load round trips work.

This is the fallback of `--isolation namespace` (isolation.py), for machines without user
namespaces. Covered: `open`/`io.open` (and so `pathlib`, `numpy.save`, logging, `torch.load`),
numpy's own opener (`savetxt`), `os.open`, `os.truncate`, `os.stat`/`os.lstat`/`os.readlink` (and
so `os.path.exists`), `os.mkdir`/`os.makedirs`, `os.remove`/`os.unlink`/`os.rmdir`,
`os.rename`/`os.replace` (a user's own file is copied, never moved), `os.symlink`,
`os.chmod`/`os.utime`/`os.chown` (so `shutil.copy2`/`copytree` work), `shutil.rmtree`,
`torch.save`, and the same in the processes `multiprocessing` spawns (DataLoader workers with the
spawn start method; forked ones inherit it). Calls relative to a directory descriptor (`dir_fd=`)
pass through. Not covered: other child processes, native code that opens files itself, and
directory listings.
"""

from __future__ import annotations

import builtins
import functools
import io
import json
import os
import shutil
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Sandbox:
    def __init__(self, protected: Sequence[str], scratch: str, exempt: Sequence[str] = ()) -> None:
        self.settings = {"protected": list(protected), "scratch": scratch, "exempt": list(exempt)}
        roots = sorted({os.path.realpath(p) for p in protected}, key=len, reverse=True)
        self.roots: List[Tuple[str, str]] = [
            (root, os.path.join(scratch, f"{index}-{os.path.basename(root) or 'root'}"))
            for index, root in enumerate(roots)
        ]
        self.exempt = [os.path.realpath(p) for p in (*exempt, scratch)]
        self.redirected: Set[str] = set()  # absolute paths (as the script spelled them) now in scratch
        self.written: List[str] = []  # what the run wrote, relative to its protected root, for the report
        self._originals: List[Tuple[Any, str, Any]] = []
        self._resolving = threading.local()

    # ------------------------------------------------------------------ path mapping
    def _target(self, path: str) -> Optional[str]:
        # realpath calls os.lstat and os.readlink, which the sandbox wraps too: they pass through meanwhile.
        self._resolving.active = True
        try:
            real = os.path.realpath(path)
        finally:
            self._resolving.active = False
        if any(_inside(real, exempt) for exempt in self.exempt):
            return None
        for root, scratch in self.roots:
            if _inside(real, root):
                return scratch + real[len(root):]
        return None

    def for_write(self, path: Any, keep_contents: bool = False) -> Any:
        """Where a write to `path` goes; `keep_contents` copies an existing file first (append/update)."""
        text = _as_text(path)
        if text is None:
            return path
        absolute = os.path.abspath(text)
        target = self._target(absolute)
        if target is None:
            return path
        _ORIGINAL_MAKEDIRS(os.path.dirname(target), exist_ok=True)
        if keep_contents and absolute not in self.redirected and os.path.isfile(absolute) and not os.path.exists(target):
            shutil.copyfile(absolute, target)
        if absolute not in self.redirected:
            self.redirected.add(absolute)
            self.written.append(os.path.relpath(absolute))
        return target

    def for_read(self, path: Any) -> Any:
        """A file this run wrote is read back from scratch; anything else from where it is."""
        if not self.redirected:
            return path
        text = _as_text(path)
        if text is None:
            return path
        absolute = os.path.abspath(text)
        if absolute in self.redirected:
            return self._target(absolute) or path
        return path

    # ------------------------------------------------------------------ installing
    def install(self) -> None:
        original_open = builtins.open

        @functools.wraps(original_open)
        def guarded_open(file, mode="r", *args, **kwargs):
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                file = self.for_write(file, keep_contents="a" in mode or "+" in mode)
            else:
                file = self.for_read(file)
            return original_open(file, mode, *args, **kwargs)

        self._replace(builtins, "open", guarded_open)
        self._replace(io, "open", guarded_open)

        original_os_open = os.open

        @functools.wraps(original_os_open)
        def guarded_os_open(path, flags, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                return original_os_open(path, flags, *args, **kwargs)
            if flags & _WRITE_FLAGS:
                # Without O_CREAT the file must exist where the write goes: copy it even if truncated.
                path = self.for_write(path, keep_contents=not (flags & os.O_TRUNC and flags & os.O_CREAT))
            else:
                path = self.for_read(path)
            return original_os_open(path, flags, *args, **kwargs)

        self._replace(os, "open", guarded_os_open)

        def directory_maker(func: Callable) -> Callable:
            @functools.wraps(func)
            def make(path, *args, **kwargs):
                text = None if kwargs.get("dir_fd") is not None else _as_text(path)
                target = self._target(os.path.abspath(text)) if text is not None else None
                if target is None:
                    return func(path, *args, **kwargs)
                _ORIGINAL_MAKEDIRS(target, exist_ok=True)
                self.redirected.add(os.path.abspath(text))
                return None

            return make

        self._replace(os, "mkdir", directory_maker(os.mkdir))
        self._replace(os, "makedirs", directory_maker(os.makedirs))

        def remover(func: Callable) -> Callable:
            @functools.wraps(func)
            def remove(path, *args, **kwargs):
                text = None if kwargs.get("dir_fd") is not None else _as_text(path)
                if text is not None and self._target(os.path.abspath(text)) is not None:
                    absolute = os.path.abspath(text)
                    if absolute in self.redirected:
                        self.redirected.discard(absolute)
                        return func(self._target(absolute), *args, **kwargs)
                    return None  # the user's file stays
                return func(path, *args, **kwargs)

            return remove

        for name in ("remove", "unlink", "rmdir"):
            self._replace(os, name, remover(getattr(os, name)))
        self._replace(shutil, "rmtree", self._rmtree(shutil.rmtree))

        def mover(func: Callable) -> Callable:
            @functools.wraps(func)
            def move(src, dst, *args, **kwargs):
                if kwargs.get("src_dir_fd") is not None or kwargs.get("dst_dir_fd") is not None:
                    return func(src, dst, *args, **kwargs)
                text = _as_text(src)
                absolute = os.path.abspath(text) if text is not None else None
                if absolute is not None and absolute not in self.redirected and self._target(absolute) is not None:
                    # Moving one of the user's own files: move a copy instead.
                    target = self.for_write(dst)
                    if os.path.isdir(absolute):
                        shutil.copytree(absolute, target, dirs_exist_ok=True)
                    else:
                        shutil.copyfile(absolute, target)
                    return None
                return func(self.for_read(src), self.for_write(dst), *args, **kwargs)

            return move

        self._replace(os, "rename", mover(os.rename))
        self._replace(os, "replace", mover(os.replace))

        original_stat = os.stat

        @functools.wraps(original_stat)
        def guarded_stat(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                return original_stat(path, *args, **kwargs)
            return original_stat(self.for_read(path), *args, **kwargs)

        self._replace(os, "stat", guarded_stat)
        for name in ("lstat", "readlink"):
            self._replace(os, name, self._reader(getattr(os, name)))
        for name in ("chmod", "utime", "chown", "truncate"):
            if hasattr(os, name):
                self._replace(os, name, self._updater(getattr(os, name)))

        original_symlink = os.symlink

        @functools.wraps(original_symlink)
        def symlink(src, dst, *args, **kwargs):
            if kwargs.get("dir_fd") is None:
                dst = self.for_write(dst)
            return original_symlink(src, dst, *args, **kwargs)

        self._replace(os, "symlink", symlink)
        self._install_numpy(guarded_open)
        self._install_spawn()

    def _reader(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def read(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None or getattr(self._resolving, "active", False):
                return func(path, *args, **kwargs)
            return func(self.for_read(path), *args, **kwargs)

        return read

    def _updater(self, func: Callable) -> Callable:
        """chmod/utime/chown/truncate of a path change a copy of the file in scratch."""

        @functools.wraps(func)
        def update(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None or isinstance(path, int):
                return func(path, *args, **kwargs)
            text = _as_text(path)
            if text is not None and self._target(os.path.abspath(text)) is not None and os.path.isdir(text):
                return None  # a protected folder's own mode and times stay
            return func(self.for_write(path, keep_contents=True), *args, **kwargs)

        return update

    def _install_numpy(self, guarded_open: Callable) -> None:
        """numpy keeps its own reference to `open` (np.savetxt, np.loadtxt go through it)."""
        datasource = getattr(getattr(sys.modules.get("numpy"), "lib", None), "_datasource", None)
        openers = getattr(getattr(datasource, "_file_openers", None), "_file_openers", None)
        if isinstance(openers, dict) and None in openers:
            self._originals.append((_DictEntry(openers, None), "entry", openers[None]))
            openers[None] = guarded_open

    def _install_spawn(self) -> None:
        """Processes multiprocessing spawns (DataLoader workers, `spawn` start method) install the
        same sandbox before they run anything of the script."""
        import multiprocessing.spawn as spawn

        original = spawn.get_command_line

        @functools.wraps(original)
        def get_command_line(**kwds):
            command = list(original(**kwds))
            if "-c" in command:
                index = command.index("-c") + 1
                state = dict(self.settings, redirected=sorted(self.redirected))
                command[index] = (
                    f"from ampmigrate.verify.sandbox import install_in_child; install_in_child({json.dumps(state)!r}); "
                    + command[index]
                )
            return command

        self._replace(spawn, "get_command_line", get_command_line)

    def install_torch(self, torch: Any) -> None:
        """`torch.save` to a path writes from native code; map the path first."""
        original_save = torch.save

        @functools.wraps(original_save)
        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, bytes, os.PathLike)):
                f = self.for_write(f)
            return original_save(obj, f, *args, **kwargs)

        self._replace(torch, "save", save)

    def _rmtree(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def rmtree(path, *args, **kwargs):
            text = _as_text(path)
            target = self._target(os.path.abspath(text)) if text is not None else None
            if target is None:
                return func(path, *args, **kwargs)
            prefix = os.path.abspath(text) + os.sep
            self.redirected = {p for p in self.redirected if not p.startswith(prefix)}
            if os.path.isdir(target):
                return func(target, *args, **kwargs)
            return None

        return rmtree

    def _replace(self, owner: Any, name: str, value: Any) -> None:
        self._originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        while self._originals:
            owner, name, value = self._originals.pop()
            setattr(owner, name, value)


_ORIGINAL_MAKEDIRS = os.makedirs


class _DictEntry:
    """`_replace`'s undo for a dictionary entry (setattr(entry, key, value) sets entry[key])."""

    def __init__(self, mapping: dict, key: Any) -> None:
        self.__dict__.update(mapping=mapping, key=key)

    def __setattr__(self, name: str, value: Any) -> None:
        self.mapping[self.key] = value


def install_in_child(state_json: str) -> None:
    """In a spawned child: the parent run's sandbox, with what it had redirected so far."""
    state = json.loads(state_json)
    sandbox = Sandbox(state["protected"], state["scratch"], state["exempt"])
    sandbox.redirected.update(state["redirected"])
    sandbox.install()


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _as_text(path: Any) -> Optional[str]:
    if isinstance(path, int):  # a file descriptor
        return None
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        return None
