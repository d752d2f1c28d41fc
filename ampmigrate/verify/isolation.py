"""Isolate a verification run by the operating system: its own user and mount namespaces.

    python -m ampmigrate.verify.isolation SPEC.json     (then execs the harness on SPEC)

Linux only, and unprivileged: unshare(2) gives the run a user namespace (the user's own uid and
gid mapped to themselves) and a mount namespace, in which

- every directory the run could write to that holds the user's files (the project root, the
  working directory, the folders the project reaches through symlinks, the temporary folder and
  the home directory) is covered by an overlay whose lower layer is that directory and whose
  upper layer lies in the run's scratch folder: reads see the user's files, every write (from
  Python, numpy, native code, a child process) lands in scratch;
- every other mount is made read-only, so a write anywhere else fails (EROFS) instead of
  reaching the user's files;
- `/dev/shm` is a fresh tmpfs (DataLoader workers share tensors there);
- the verify folder (results, logs, the migrated copy) stays writable where it was.

The mounts are made by this small launcher, which then execs the harness: the script runs with
the user's own uid and no capabilities. Nothing propagates back (the namespace is private).
Kernel facts used: unprivileged overlay mounts in a user namespace (Linux 5.11),
mount_setattr(2) (Linux 5.12; syscall 442 on every architecture).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
SYS_MOUNT_SETATTR = 442
MOUNT_ATTR_RDONLY = 0x1
# Never overlaid nor made read-only: the kernel's own file systems.
_SYSTEM_MOUNTS = ("/proc", "/sys", "/dev")
# What namespace isolation catches that the fallback (redirection inside Python) cannot.
REDIRECT_BLIND_SPOTS = (
    "writes from child processes (a shell appending to a file, a spawned tool), from native code "
    "that opens files itself (other than torch.save) and through directory descriptors"
)


class IsolationError(Exception):
    pass


# ------------------------------------------------------------------------------ the plan (parent side)
def with_this_ampmigrate(env: Dict[str, str]) -> Dict[str, str]:
    """`env` for a `python -m ampmigrate.verify...` child, which must import this ampmigrate: from a
    source tree that is not installed (the child's working directory is the user's), or from a git
    worktree beside an installed checkout (the child would run the installed harness and emulation
    reporting), its folder is appended to PYTHONPATH. An installed ampmigrate (site-packages) is
    found anyway and is left out, so the user's PYTHONPATH keeps its order before the stdlib."""
    import ampmigrate

    root = os.path.dirname(os.path.dirname(os.path.abspath(ampmigrate.__file__)))
    entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if os.path.basename(root) not in ("site-packages", "dist-packages") and root not in entries:
        env["PYTHONPATH"] = os.pathsep.join([*entries, root])
    return env


def choose_isolation(requested: str, notes: List[str]) -> str:
    """`--isolation`: "namespace" where the machine allows it, else (auto) the redirection inside
    Python, with a note naming what that cannot catch; ValueError when namespaces were required."""
    if requested == "redirect":
        notes.append(f"--isolation redirect: the runs' writes are redirected inside Python, which cannot catch {REDIRECT_BLIND_SPOTS}")
        return "redirect"
    reason = unavailable_reason()
    if reason is None:
        return "namespace"
    if requested == "namespace":
        raise ValueError(f"--isolation namespace is not available here: {reason}")
    notes.append(
        f"runs are not isolated by namespaces here ({reason}); their writes are redirected inside Python, "
        f"which cannot catch {REDIRECT_BLIND_SPOTS}"
    )
    return "redirect"


def protected_folders(folders: Sequence[str]) -> List[str]:
    """The folders whose files no run may change: the given ones and those they link to."""
    real = list(dict.fromkeys(os.path.realpath(folder) for folder in folders))
    return real + [target for target in symlink_targets(real) if target not in real]


def overlay_targets(protect: Sequence[str], workdir: str) -> List[str]:
    """The directories to overlay: the protected ones, what they reach through symlinks, the
    temporary folder and the home directory; never `/`, nor a directory with mounts below it
    (an overlay would hide them); nested ones are covered by the outer overlay."""
    candidates = [os.path.realpath(p) for p in protect]
    candidates += symlink_targets(candidates)
    for extra in (tempfile.gettempdir(), "/tmp", "/var/tmp", os.path.expanduser("~")):
        candidates.append(os.path.realpath(extra))
    mounts = mount_points()
    workdir = os.path.realpath(workdir)
    chosen: List[str] = []
    for path in sorted({c for c in candidates if os.path.isdir(c)}, key=len):
        if path == os.sep or _inside(path, workdir) or any(_inside(path, kept) for kept in chosen):
            continue
        if any(_inside(mount, path) and mount != path for mount in mounts):
            continue  # stays read-only: writes there fail rather than leak
        if any(_inside(path, system) for system in _SYSTEM_MOUNTS):
            continue
        chosen.append(path)
    return chosen


def symlink_targets(roots: Sequence[str], limit: int = 200_000) -> List[str]:
    """Directories outside `roots` that files or folders inside them link to."""
    from ampmigrate.verify.project import skipped_dir

    found: Dict[str, None] = {}
    seen = 0
    for root in roots:
        for directory, subdirectories, files in os.walk(root):
            kept = []
            for name in subdirectories + files:
                seen += 1
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    try:
                        real = os.path.realpath(path)
                    except OSError:  # a loop, or a link the user may not follow
                        continue
                    target = real if os.path.isdir(real) else os.path.dirname(real)
                    if not any(_inside(target, r) for r in roots):
                        found[target] = None
                elif name in subdirectories and not skipped_dir(name) and path not in _SYSTEM_MOUNTS:
                    kept.append(name)
            subdirectories[:] = kept
            if seen > limit:
                return list(found)
    return list(found)


def plan(protect: Sequence[str], workdir: str, scratch: str) -> Dict[str, object]:
    """What the launcher mounts for one run (stored in the run's spec)."""
    overlays = []
    for index, target in enumerate(overlay_targets(protect, workdir)):
        layer = os.path.join(scratch, "overlay", str(index))
        os.makedirs(os.path.join(layer, "upper"))
        os.makedirs(os.path.join(layer, "work"))
        try:  # the merged root takes the upper root's mode: keep the original's (/tmp: 1777)
            os.chmod(os.path.join(layer, "upper"), stat.S_IMODE(os.stat(target).st_mode))
        except OSError:
            pass
        overlays.append({"target": target, "upper": os.path.join(layer, "upper"), "work": os.path.join(layer, "work")})
    return {"overlays": overlays, "workdir": os.path.realpath(workdir)}


def written_files(namespace_plan: Dict[str, object], protect: Sequence[str], cwd: str) -> List[str]:
    """Files the run wrote under the protected folders (found in the upper layers), relative to `cwd`."""
    roots = [os.path.realpath(p) for p in protect]
    found = []
    for overlay in namespace_plan.get("overlays", []):
        upper = overlay["upper"]
        for directory, _, files in os.walk(upper):
            for name in files:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    continue  # a whiteout: the run deleted a file
                original = os.path.join(overlay["target"], os.path.relpath(path, upper))
                if any(_inside(original, root) for root in roots):
                    found.append(os.path.relpath(original, cwd))
    return sorted(found)


def mount_points() -> List[str]:
    points = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            for line in handle:
                points.append(_unescape(line.split()[4]))
    except OSError:
        pass
    return points


_PROBED: Dict[str, Optional[str]] = {}


def unavailable_reason() -> Optional[str]:
    """None when runs can be isolated by namespaces here, else why not (probed once, in a subprocess)."""
    if "reason" not in _PROBED:
        _PROBED["reason"] = _probe()
    return _PROBED["reason"]


def _probe() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"user and mount namespaces are Linux only (this is {sys.platform})"
    # Removed in a `finally` of our own, whatever ends the probe (Ctrl-C, SIGTERM as Terminated):
    # overlay leaves its work folder with mode 000, which a plain rmtree cannot enter.
    folder = tempfile.mkdtemp(prefix="ampmigrate-probe-")
    try:
        for name in ("lower", "upper", "work"):
            os.mkdir(os.path.join(folder, name))
        try:
            completed = subprocess.run(
                [sys.executable, "-m", "ampmigrate.verify.isolation", "--probe", folder],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                env=with_this_ampmigrate(dict(os.environ)),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the namespace probe failed: {exc}"
    finally:
        _make_removable(folder)
        shutil.rmtree(folder, ignore_errors=True)
    if completed.returncode != 0:
        lines = (completed.stderr or completed.stdout).strip().splitlines()
        return lines[-1] if lines else f"the namespace probe exited with {completed.returncode}"
    return None


def _make_removable(folder: str) -> None:
    """Overlay's work folder is left with mode 000; let its owner remove it."""
    for directory, subdirectories, _ in os.walk(folder):
        for name in subdirectories:
            try:
                os.chmod(os.path.join(directory, name), 0o700)
            except OSError:
                pass


# ------------------------------------------------------------------------------ entering (child side)
_libc = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str] = None) -> None:
    encode = lambda value: None if value is None else os.fsencode(value)  # noqa: E731
    _check(_c().mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)), f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _make_read_only(path: str) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    AT_FDCWD = -100
    _check(
        _c().syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), os.fsencode(path), ctypes.c_uint(0),
                     ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
        f"read-only {path}",
    )


def _enter_namespaces() -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_c().unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS)), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the user's namespace


def _overlay(target: str, upper: str, work: str) -> None:
    options = f"lowerdir={_escape(target)},upperdir={_escape(upper)},workdir={_escape(work)}"
    try:
        _mount("overlay", target, "overlay", 0, options + ",userxattr")
    except IsolationError:  # kernels before 5.11 know no userxattr (and then no unprivileged overlay)
        _mount("overlay", target, "overlay", 0, options)


def enter(namespace_plan: Dict[str, object]) -> None:
    """Set up the run's namespaces (see the module docstring); the caller then execs the run."""
    cwd = os.getcwd()
    workdir = str(namespace_plan["workdir"])
    _enter_namespaces()
    workdir_fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)  # a mount of this namespace, before the overlays
    # The overlay over the folder that holds the verify folder (and so the upper layers) goes last:
    # after it, those paths lead into an overlay, where no upper layer can lie.
    overlays = sorted(namespace_plan.get("overlays", []), key=lambda overlay: _inside(workdir, overlay["target"]))
    for overlay in overlays:
        _overlay(overlay["target"], overlay["upper"], overlay["work"])
    writable = [overlay["target"] for overlay in overlays]
    if any(_inside(workdir, target) for target in writable):
        _mount(f"/proc/self/fd/{workdir_fd}", workdir, None, MS_BIND | MS_REC)  # the real folder again
    os.close(workdir_fd)
    writable.append(workdir)
    if os.path.isdir("/dev/shm"):
        try:
            _mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777")
        except IsolationError:
            pass  # then shared memory stays the system's (not the user's files)
    for point in reversed(mount_points()):
        if point in writable or any(_inside(point, system) for system in _SYSTEM_MOUNTS):
            continue
        try:
            _make_read_only(point)
        except IsolationError:
            if point == os.sep:
                raise
    os.chdir(cwd)  # the old working directory is the folder under the overlay: enter the overlay


def _probe_main(folder: str) -> None:
    lower = os.path.join(folder, "lower")
    with open(os.path.join(lower, "file"), "w") as handle:
        handle.write("original")
    _enter_namespaces()
    _overlay(lower, os.path.join(folder, "upper"), os.path.join(folder, "work"))
    with open(os.path.join(lower, "file"), "r+") as handle:
        handle.truncate(1)
    _make_read_only(os.sep)


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def _unescape(field: str) -> str:
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and index + 3 < len(field) and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def main(argv: List[str]) -> None:
    if argv[1:2] == ["--probe"]:
        try:
            _probe_main(argv[2])
        except (IsolationError, OSError) as exc:
            print(f"{exc}", file=sys.stderr)
            sys.exit(1)
        return
    spec_path = argv[1]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        enter(spec["namespace"])
    except (IsolationError, OSError) as exc:
        result = {"status": "harness_error", "error": {"type": "IsolationError", "message": f"could not isolate the run: {exc}"}}
        with open(spec["result"], "w", encoding="utf-8") as handle:
            json.dump(result, handle)
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "ampmigrate.verify.harness", spec_path])


if __name__ == "__main__":
    main(sys.argv)
