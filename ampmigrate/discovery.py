"""Which files a run looks at.

Directories are walked recursively for `*.py`, `*.pyi` and `*.ipynb`, in sorted order, skipping the default
excludes, the configured `exclude`/`extend-exclude` patterns (gitignore syntax, relative to the
configuration's directory, or matched against a file or directory name), and whatever `.gitignore`
files ignore (from the repository root down). Paths named on the command line are always checked,
like ruff: a file even when excluded, a directory even when it lies below an excluded one (`venv/x`;
its contents are then matched against the patterns relative to it), unless `force_exclude`. Symlinked
directories are followed, except into themselves (a loop is reported once and skipped).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ampmigrate import gitignore
from ampmigrate.config import Settings
from ampmigrate.diagnostics import FileError

SOURCE_SUFFIXES = (".py", ".pyi")
# What a directory walk picks up: Python sources and Jupyter notebooks.
DISCOVERED_SUFFIXES = SOURCE_SUFFIXES + (".ipynb",)


@dataclass
class Discovery:
    files: List[str] = field(default_factory=list)
    errors: List[FileError] = field(default_factory=list)


def _git_root(start: Path) -> Path:
    for directory in (start, *start.parents):
        if _exists(directory / ".git"):
            return directory
    return start


def _exists(path: Path, regular_file: bool = False) -> bool:
    """`path.exists()` / `path.is_file()`, False where it cannot be looked at: in a directory
    that can be listed but not entered, `stat` fails with EACCES, which pathlib re-raises."""
    try:
        return path.is_file() if regular_file else path.exists()
    except OSError:
        return False


def _read_ignore(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _realpath(path) -> str:
    """`os.path.realpath`, or the absolute path where resolving a link raises (a symlink into
    `/proc/<pid>/` of another user's process raises PermissionError, not a loop)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return os.path.abspath(path)


class _Walker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = Path(settings.root).resolve()
        self.excludes = gitignore.parse("\n".join(settings.exclude + settings.extend_exclude), "")
        self.result = Discovery()
        self.seen: Set[str] = set()
        self._root_prefix = str(self.root).rstrip(os.sep) + os.sep
        self._name_excluded: Dict[Tuple[str, bool], bool] = {}
        # The directory named on the command line, when it is itself excluded (see `walk`).
        self._anchor_prefix: Optional[str] = None

    def _relative_to_root(self, path: str) -> Optional[str]:
        """`path` (absolute) relative to the root in posix form, or None if outside."""
        if path == str(self.root):
            return "."
        if path.startswith(self._root_prefix):
            return path[len(self._root_prefix) :].replace(os.sep, "/")
        return None

    def _excluded(self, path: Path, is_dir: bool, real_parent: Optional[str] = None) -> bool:
        """Matched against the path as walked (a symlink's own path, like the .gitignore check),
        else its real path (when the walk started through a symlink), else its name.
        `real_parent`: the resolved directory `path` is in when `path` is not a symlink, which
        saves resolving every entry of a large tree again. Never raises on symlink loops."""
        real = os.path.join(real_parent, path.name) if real_parent is not None else _realpath(path)
        absolute = os.path.abspath(path)
        if self._anchor_prefix is not None and absolute.startswith(self._anchor_prefix):
            relative = absolute[len(self._anchor_prefix) :].replace(os.sep, "/")
        else:
            relative = self._relative_to_root(absolute) or self._relative_to_root(real)
        if gitignore.is_ignored(self.excludes, relative or path.name, is_dir):
            return True
        key = (path.name, is_dir)
        excluded = self._name_excluded.get(key)
        if excluded is None:
            excluded = self._name_excluded[key] = gitignore.is_ignored(self.excludes, path.name, is_dir)
        return excluded

    def add_file(self, path: str, real: Optional[str] = None) -> None:
        # One file reached through several paths (a symlink to it, a symlinked directory) is
        # checked once, under the first path found: fixing it twice would conflict. `real`: its
        # real path where the walk knows it (a file that is no symlink, in a resolved directory).
        key = real if real is not None else _realpath(path)
        if key not in self.seen:
            self.seen.add(key)
            self.result.files.append(path)

    def explicitly_excluded(self, path: Path, is_dir: bool) -> bool:
        """Whether a path named on the command line is excluded (for `force_exclude`)."""
        absolute = Path(os.path.abspath(path))
        if self._excluded(absolute, is_dir) or any(self._excluded(parent, True) for parent in absolute.parents):
            return True
        if not self.settings.respect_gitignore:
            return False
        repo = _git_root(absolute)
        try:
            relative = absolute.relative_to(repo).as_posix()
        except ValueError:
            return False
        return gitignore.is_ignored(self._ignore_chain(repo, absolute), relative, is_dir)

    def _ignore_chain(self, repo: Path, top_abs: Path) -> List[gitignore.Pattern]:
        """The patterns of the .gitignore files from the repository root down to `top` (not its own)."""
        patterns: List[gitignore.Pattern] = []
        chain = [repo, *[p for p in reversed(top_abs.parents) if repo in p.parents]]
        if top_abs != repo:
            chain.append(top_abs)
        for directory in dict.fromkeys(chain):
            if directory == top_abs:
                continue
            base = directory.relative_to(repo).as_posix() if directory != repo else ""
            patterns += gitignore.parse(_read_ignore(directory / ".gitignore"), "" if base == "." else base)
        return patterns

    def walk(self, top: Path) -> None:
        top_abs = Path(os.path.abspath(top))
        patterns: List[gitignore.Pattern] = []
        repo = _git_root(top_abs)
        # A directory named on the command line is checked even below an excluded one (`venv/proj`):
        # its contents are then matched relative to it, not through the excluded ancestor.
        relative_top = self._relative_to_root(str(top_abs))
        self._anchor_prefix = None
        if relative_top not in (None, ".") and gitignore.is_ignored(self.excludes, relative_top, True):
            self._anchor_prefix = str(top_abs).rstrip(os.sep) + os.sep
        if self.settings.respect_gitignore:
            # .gitignore files from the repository root down to `top` apply to it, unless they
            # ignore `top` itself (then it was named on purpose).
            patterns = self._ignore_chain(repo, top_abs)
            relative_repo = top_abs.relative_to(repo).as_posix() if top_abs != repo else "."
            if relative_repo != "." and gitignore.is_ignored(patterns, relative_repo, True):
                patterns = []
        self._walk_dir(top, top_abs, repo, patterns, ancestors=frozenset())

    def _walk_dir(self, display: Path, absolute: Path, repo: Path, patterns, ancestors) -> None:
        real = _realpath(absolute)
        if real in ancestors:
            self.result.errors.append(FileError(str(display), "symlink loop; directory skipped"))
            return
        ancestors = ancestors | {real}
        if self.settings.respect_gitignore:
            ignore_file = absolute / ".gitignore"
            if _exists(ignore_file, regular_file=True):
                try:
                    base = absolute.relative_to(repo).as_posix()
                except ValueError:
                    base = ""
                patterns = patterns + gitignore.parse(_read_ignore(ignore_file), "" if base == "." else base)
        try:
            entries = sorted(os.scandir(absolute), key=lambda e: e.name)
        except OSError as exc:
            self.result.errors.append(FileError(str(display), f"cannot list directory: {exc.strerror or exc}"))
            return
        for entry in entries:
            child_display = display / entry.name
            child_abs = absolute / entry.name
            try:
                is_dir = entry.is_dir()  # follows symlinks
            except OSError:
                is_dir = False
            try:
                is_link = entry.is_symlink()
            except OSError:
                is_link = True
            if self._excluded(child_abs, is_dir, None if is_link else real):
                continue
            if patterns:
                try:
                    relative = child_abs.relative_to(repo).as_posix()
                except ValueError:
                    relative = entry.name
                if gitignore.is_ignored(patterns, relative, is_dir, parents_checked=True):
                    continue
            if is_dir:
                self._walk_dir(child_display, child_abs, repo, patterns, ancestors)
            elif entry.name.endswith(DISCOVERED_SUFFIXES):
                problem = _not_a_source_file(child_abs)
                if problem:
                    self.result.errors.append(FileError(str(child_display), problem))
                    continue
                self.add_file(str(child_display), None if is_link else os.path.join(real, entry.name))


def _not_a_source_file(path: Path) -> Optional[str]:
    """Why a `*.py` entry of a walked directory cannot be read as a file, or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop"
        if os.path.islink(path):
            return f"broken symlink (its target {os.readlink(path)!r} does not exist)"
        return f"cannot read file: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return "not a regular file (a pipe, socket or device)"
    return None


def discover(paths: Sequence[str], settings: Settings, force_exclude: bool = False) -> Discovery:
    """The files under `paths`; `force_exclude`: apply the excludes to the paths themselves too."""
    walker = _Walker(settings)
    for raw in paths:
        path = Path(raw)
        if force_exclude and os.path.lexists(path) and walker.explicitly_excluded(path, path.is_dir()):
            continue
        if path.is_dir():
            walker.walk(path)
        elif path.is_file() or os.path.lexists(path):
            walker.add_file(raw)  # explicit files are always checked (and errors reported)
        else:
            walker.result.errors.append(FileError(raw, "no such file or directory"))
    return walker.result
