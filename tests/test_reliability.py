"""Nothing takes the run down and nothing hangs (issue 14): parser crashes, files over their
time or memory budget, pipes and devices, unreadable directories, read-only directories, a killed
parent, diffs of files without a final newline, and bytes that are not text.

Every case that could crash or hang runs the real command line in a subprocess with a timeout.
A crash or a hang inside a worker is simulated where no real input produces it any more (the
`ast` gate keeps the inputs that crashed LibCST away from it): `_run_patched` starts ampmigrate
with `Engine.check_text` replaced for files whose name says what to do.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT

from ampmigrate.cli import main
from ampmigrate.config import Settings
from ampmigrate.discovery import discover
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.runner import Job, run_files
from ampmigrate.source import FileTooLarge, SourceError, read_regular_file

LEGACY = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"
FIXED = 'import torch\nwith torch.amp.autocast("cuda"):\n    pass\n'
TIMEOUT = 180  # seconds: far above what any of these runs needs, even on a busy machine

# Replaces Engine.check_text/fix_text in the subprocess: `crash*.py` segfaults the process,
# `spin*.py` loops forever, `hog*.py` allocates memory until stopped.
MISBEHAVE = textwrap.dedent(
    """
    import os, signal, sys
    from ampmigrate.engine import pipeline

    def misbehave(path):
        name = os.path.basename(path)
        if name.startswith("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if name.startswith("spin"):
            while True:
                pass
        if name.startswith("hog"):
            hoard = [b"x" * (16 << 20) for _ in range(256)]  # 4 GiB unless stopped
    """
)
_PATCH = MISBEHAVE + textwrap.dedent(
    """
    for method in ("check_text", "fix_text"):
        original = getattr(pipeline.Engine, method)
        def patched(self, text, path, _original=original, **kwargs):
            misbehave(path)
            return _original(self, text, path, **kwargs)
        setattr(pipeline.Engine, method, patched)

    from ampmigrate.cli import main
    sys.argv[0] = "ampmigrate"
    main()
    """
)


_CACHES = tempfile.TemporaryDirectory(prefix="amp-cache-")  # removed when the test session ends


def _env():
    cache = tempfile.mkdtemp(dir=_CACHES.name)  # a fresh cache per command
    return {**os.environ, "PYTHONPATH": str(ROOT), "AMPMIGRATE_CACHE_DIR": cache}


def _run(cwd, *args, timeout=TIMEOUT):
    return subprocess.run(
        [sys.executable, "-m", "ampmigrate", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _run_patched(cwd, *args, timeout=TIMEOUT):
    return subprocess.run(
        [sys.executable, "-c", _PATCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _errors(stderr):
    return sorted(line for line in stderr.splitlines() if line.startswith("error: "))


def _tree(root: Path, bad: dict, good=8) -> Path:
    """`good` legacy files (enough for several workers) beside the `bad` ones."""
    for i in range(good):
        (root / f"good{i}.py").write_text(LEGACY, encoding="utf-8")
    for name, text in bad.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------- 1. crashes
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_python_rejects_never_reaches_libcst(tmp_path, jobs):
    # 2,000 nested brackets made LibCST's native parser segfault; `ast` rejects them at once.
    nested = "import torch.cuda.amp\nx = " + "(" * 2000 + "1" + ")" * 2000 + "\n"
    chain = "import torch.cuda.amp\nx = " + "+".join(["1"] * 20000) + "\n"
    _tree(tmp_path, {"nested.py": nested, "chain.py": chain})
    result = _run(tmp_path, "check", "--output-format", "concise", "-j", jobs, ".")
    assert result.returncode == 2, result.stderr
    assert _errors(result.stderr) == [
        "error: chain.py: too deeply nested to analyse (e.g. a chain of hundreds of operators); skipped",
        "error: nested.py: syntax error at 2:205: too many nested parentheses",
    ]
    assert result.stdout.count("AMP201") == 8


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_worker_that_dies_costs_only_its_file(tmp_path, jobs):
    _tree(tmp_path, {"crash.py": LEGACY, "crash_too.py": LEGACY})
    result = _run_patched(tmp_path, "check", "--output-format", "concise", "-j", jobs, ".")
    assert result.returncode == 2, result.stderr
    assert _errors(result.stderr) == [
        f"error: {name}: internal error: the process analysing this file died (killed by SIGSEGV); file skipped"
        for name in ("crash.py", "crash_too.py")
    ]
    assert sorted(line.split(":")[0] for line in result.stdout.splitlines() if "AMP201" in line) == [
        f"good{i}.py" for i in range(8)
    ]


def test_fix_goes_on_after_a_worker_dies(tmp_path):
    _tree(tmp_path, {"crash.py": LEGACY}, good=3)
    result = _run_patched(tmp_path, "fix", "-j", "1", ".")
    assert result.returncode == 2
    assert "Fixed 3 findings in 3 files." in result.stdout
    assert [(tmp_path / f"good{i}.py").read_text(encoding="utf-8") for i in range(3)] == [FIXED] * 3
    assert (tmp_path / "crash.py").read_text(encoding="utf-8") == LEGACY


# ---------------------------------------------------------------------------------- 2. budgets
def test_a_file_over_its_time_budget_is_skipped(tmp_path):
    # Real LibCST work: 40 operator chains that `ast` accepts, each a fifth of a second or more
    # of LibCST parsing, against a budget of one second.
    chains = [f"x{i} = " + "+".join(["1"] * 900) for i in range(40)]
    _tree(tmp_path, {"slow.py": LEGACY + "\n".join(chains) + "\n"}, good=2)
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nfile-time-limit = 1\n", encoding="utf-8")
    result = _run(tmp_path, "check", "--output-format", "concise", ".")
    assert result.returncode == 2
    assert _errors(result.stderr) == ["error: slow.py: skipped: analysing it took more than 1 s (file-time-limit)"]
    assert result.stdout.count("AMP201") == 2


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_that_never_ends_is_stopped(tmp_path, jobs):
    _tree(tmp_path, {"spin.py": LEGACY})
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nfile-time-limit = 1\n", encoding="utf-8")
    result = _run_patched(tmp_path, "check", "--output-format", "concise", "-j", jobs, ".")
    assert result.returncode == 2
    assert _errors(result.stderr) == ["error: spin.py: skipped: analysing it took more than 1 s (file-time-limit)"]
    assert result.stdout.count("AMP201") == 8


def test_a_file_over_its_memory_budget_is_skipped(tmp_path):
    _tree(tmp_path, {"hog.py": LEGACY}, good=2)
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nfile-memory-limit = 400\n", encoding="utf-8")
    result = _run_patched(tmp_path, "check", "--output-format", "concise", ".")
    assert result.returncode == 2
    assert _errors(result.stderr) == [
        "error: hog.py: skipped: analysing it needed more than 400 MiB of memory (file-memory-limit)"
    ]
    assert result.stdout.count("AMP201") == 2


def test_memory_the_parent_held_before_the_fork_is_not_a_files(tmp_path):
    """A parent holding 600 MiB when it forks its workers (the index of a tree of 18,000 files held
    2.4 GiB): each worker starts with those pages resident, and no file is skipped for them under
    a 300 MiB budget."""
    _tree(tmp_path, {}, good=4)
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nfile-memory-limit = 300\n", encoding="utf-8")
    ballast = textwrap.dedent(
        """
        import time
        from ampmigrate.engine import pipeline
        ballast = [b"x" * (16 << 20) for _ in range(38)]  # about 600 MiB, every page written
        _check_text = pipeline.Engine.check_text
        def slow(self, text, path, **kwargs):  # long enough for the parent to look at the worker
            time.sleep(0.3)
            return _check_text(self, text, path, **kwargs)
        pipeline.Engine.check_text = slow
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", ballast + _PATCH, "check", "--output-format", "concise", "-j", "2", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )
    assert _errors(result.stderr) == [], result.stderr
    assert result.stdout.count("AMP201") == 4


# ---------------------------------------------------------------------------------- 3. pipes, devices
@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("command", ["check", "fix"])
def test_pipes_and_devices_on_the_command_line_neither_block_nor_fill_memory(tmp_path, command):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    result = _run(tmp_path, command, "pipe.py", "/dev/zero", "good.py", timeout=60)
    assert result.returncode == 2
    assert _errors(result.stderr) == [
        "error: /dev/zero: not a regular file (a pipe, socket or device)",
        "error: pipe.py: not a regular file (a pipe, socket or device)",
    ]
    if command == "fix":
        assert (tmp_path / "good.py").read_text(encoding="utf-8") == FIXED


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_the_safe_read_refuses_what_is_not_a_regular_file_within_the_limit(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    with pytest.raises(SourceError, match="not a regular file"):
        read_regular_file(str(tmp_path / "pipe.py"))
    if os.path.exists("/dev/zero"):
        with pytest.raises(SourceError, match="not a regular file"):
            read_regular_file("/dev/zero")
    (tmp_path / "big.py").write_bytes(b"x = 1\n" * 100)
    with pytest.raises(FileTooLarge):
        read_regular_file(str(tmp_path / "big.py"), limit=599)
    assert read_regular_file(str(tmp_path / "big.py"), limit=600) == b"x = 1\n" * 100
    # The project's import scan reads through it too: a pipe is skipped, not waited on.
    (tmp_path / "user.py").write_text("from lib import autocast\n", encoding="utf-8")
    index = ProjectImports.scan(str(tmp_path), [str(tmp_path / "pipe.py"), str(tmp_path / "user.py")])
    assert index.imported_from(str(tmp_path / "lib.py")) == {"autocast"}


# ---------------------------------------------------------------------------------- 4. directories
def test_a_directory_that_can_be_listed_but_not_entered_does_not_abort_discovery(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "inner.py").write_text(LEGACY, encoding="utf-8")
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    # What stat() does in a directory with r but not x permission (root bypasses the bits).
    real_stat = os.stat

    def no_entry(path, *args, **kwargs):
        if os.fspath(path).startswith(str(locked) + os.sep):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", no_entry)
    found = discover([str(tmp_path)], Settings(root=str(tmp_path)))
    assert found.files == [str(tmp_path / "good.py")]
    assert [(e.path, e.message) for e in found.errors] == [
        (str(locked / "inner.py"), "cannot read file: Permission denied")
    ]


def test_a_link_whose_target_cannot_be_resolved_does_not_abort_discovery(tmp_path, monkeypatch):
    # A symlink into another process's /proc/<pid>/ (cwd, root) raises PermissionError when
    # resolved, even for root in a container; a run over /tmp met one and stopped.
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    target = tmp_path.parent / (tmp_path.name + "-target")
    target.mkdir()
    (target / "inner.py").write_text(LEGACY, encoding="utf-8")
    link = tmp_path / "proc_cwd"
    link.symlink_to(target, target_is_directory=True)
    real_realpath = os.path.realpath

    def unresolvable(path, *args, **kwargs):
        if os.fspath(path).startswith(str(link)):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_realpath(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", unresolvable)
    found = discover([str(tmp_path)], Settings(root=str(tmp_path)))
    assert str(tmp_path / "good.py") in found.files


@pytest.mark.skipif(not os.path.islink("/proc/1/cwd"), reason="no /proc")
def test_a_real_proc_link_in_the_tree_does_not_abort_the_run(tmp_path):
    try:
        os.path.realpath("/proc/1/cwd")
        unresolvable = False
    except OSError:
        unresolvable = True
    if not unresolvable:
        pytest.skip("this process may resolve /proc/1/cwd")
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    (tmp_path / "proc_cwd").symlink_to("/proc/1/cwd", target_is_directory=True)
    result = _run(tmp_path, "check", "--output-format", "concise", ".")
    assert "internal error" not in result.stderr
    assert "good.py:2:6: AMP201" in result.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root enters any directory")
def test_a_directory_without_execute_permission_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "inner.py").write_text(LEGACY, encoding="utf-8")
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    locked.chmod(stat.S_IRUSR)
    try:
        result = _run(tmp_path, "check", "--output-format", "concise", ".")
    finally:
        locked.chmod(stat.S_IRWXU)
    assert result.returncode == 2 and "internal error" not in result.stderr
    assert "good.py:2:6: AMP201" in result.stdout


# ---------------------------------------------------------------------------------- 5. read-only
def test_fix_in_a_read_only_directory_is_that_files_error(tmp_path, monkeypatch):
    (tmp_path / "a_readonly").mkdir()
    (tmp_path / "b_writable").mkdir()
    (tmp_path / "a_readonly" / "x.py").write_text(LEGACY, encoding="utf-8")
    (tmp_path / "b_writable" / "y.py").write_text(LEGACY, encoding="utf-8")
    readonly = str(tmp_path / "a_readonly")
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):  # what a read-only directory answers (root bypasses the bits)
        if kwargs.get("dir") == readonly:
            raise PermissionError(errno.EACCES, "Permission denied", readonly)
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["fix", "--no-cache", "-j", "1", "a_readonly", "b_writable"])
    assert result.exit_code == 2
    assert "Fixed 1 finding in 1 file." in result.stdout
    assert "error: a_readonly/x.py: cannot write file: Permission denied" in result.stderr
    assert (tmp_path / "a_readonly" / "x.py").read_text(encoding="utf-8") == LEGACY
    assert (tmp_path / "b_writable" / "y.py").read_text(encoding="utf-8") == FIXED
    assert sorted(p.name for p in (tmp_path / "a_readonly").iterdir()) == ["x.py"]


# ---------------------------------------------------------------------------------- 6. parent killed
def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != b"Z":
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_parent_killed_by_sigkill(tmp_path):
    _tree(tmp_path, {"spin.py": LEGACY, "spin_too.py": LEGACY})
    parent = subprocess.Popen(
        [sys.executable, "-c", _PATCH, "check", "-j", "2", "."],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )
    try:
        deadline = time.monotonic() + 60
        workers = []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = _children(parent.pid)
        assert len(workers) == 2
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        parent.kill()
        for pid in _children(parent.pid):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------- 7. diff
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fix_diff_of_files_without_a_final_newline_applies(tmp_path):
    (tmp_path / "a.py").write_text("import torch\nctx = torch.cuda.amp.autocast()", encoding="utf-8")  # last line changes
    (tmp_path / "b.py").write_text("import torch\nx = torch.cuda.amp.autocast()\ny = 1", encoding="utf-8")
    result = _run(tmp_path, "fix", "--diff", "a.py", "b.py")
    assert result.returncode == 1, result.stderr
    assert result.stdout.count("\\ No newline at end of file\n") == 3  # a.py: - and +; b.py: context
    check = subprocess.run(
        ["git", "apply", "--check", "-p0", "-"], cwd=tmp_path, input=result.stdout, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", "-p0", "-"], cwd=tmp_path, input=result.stdout, check=True, text=True)
    assert (tmp_path / "a.py").read_text(encoding="utf-8") == 'import torch\nctx = torch.amp.autocast("cuda")'
    assert (tmp_path / "b.py").read_text(encoding="utf-8").endswith('autocast("cuda")\ny = 1')


# ---------------------------------------------------------------------------------- 8. bytes
@pytest.mark.parametrize(
    "data,message",
    [
        (b"# \xff\nimport torch\n", "not valid utf-8 text at byte 2"),
        (b"import torch\n# \xff\n", "not valid utf-8 text at byte 15"),
        (b"import torch\nx = 1\n# \xff", "not valid utf-8 text at byte 21"),
        (b"x = 1\n\xff", "not valid utf-8 text at byte 6"),  # no trigger: still the same error
        (b"\xef\xbb\xbfx = 1\n# \xff\n", "not valid utf-8-sig text at byte 11"),
        (b"# coding: ascii\nx = 1\n# \xe9\n", "not valid ascii text at byte 24"),
        # Binary data: high bytes do not decode; ASCII-only binary is not Python.
        (bytes(range(1, 256)) * 4, "not valid utf-8 text at byte 127"),
        (b"\x7fELF\x02\x01\x01\x03" + bytes(range(1, 32)) * 8, "not Python source: syntax error at 1:1: invalid non-printable character U+007F"),
    ],
)
@pytest.mark.parametrize("command", ["check", "fix"])
def test_bytes_that_are_not_text_are_one_error_wherever_they_are(tmp_path, data, message, command):
    (tmp_path / "bad.py").write_bytes(data)
    (tmp_path / "good.py").write_text(LEGACY, encoding="utf-8")
    result = run_files([str(tmp_path / "bad.py"), str(tmp_path / "good.py")], Settings(), Job(command), jobs=1)
    assert [e.path for e in result.all_errors] == [str(tmp_path / "bad.py")]
    assert result.all_errors[0].message.startswith(message)
    assert [f.path for f in result.findings] == [str(tmp_path / "good.py")] * (command == "check")


def test_control_characters_inside_strings_and_comments_are_fine(tmp_path):
    (tmp_path / "ok.py").write_bytes(b'import torch\nx = "\x01\x1b[0m"  # \x02\n')
    result = run_files([str(tmp_path / "ok.py")], Settings(), Job("check"), jobs=1)
    assert result.all_errors == [] and result.findings == []


@pytest.mark.parametrize("lines", [0, 1])
def test_a_reader_that_stops_reading_ends_the_run_quietly(tmp_path, lines):
    """`ampmigrate check . | head -N`: the closed pipe is no internal error (status 1, as Python's
    documentation suggests for a broken pipe, and nothing on stderr)."""
    for index in range(30):
        (tmp_path / f"train_{index}.py").write_text(
            "import torch\n\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n",
            encoding="utf-8",
        )
    reader = subprocess.Popen(["head", f"-{lines}"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", "--no-cache", str(tmp_path)],
        stdout=reader.stdin, stderr=subprocess.PIPE, env=_env(), timeout=120,
    )
    reader.stdin.close()
    reader.wait(timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == b"", proc.stderr


def test_commented_out_crlf_lines_do_not_stall_the_project_index(tmp_path):
    """A run of commented-out lines with CRLF breaks inside brackets, before a name that is not
    `.state_dict`: the index's pre-filter regexes (engine/project_index.py, `_GAP`) once read each
    CRLF break two ways and backtracked exponentially (60 such lines: hours)."""
    lines = ["def save(model, path):", "    total = (path"]
    lines += ["        #  kept for later (" for _ in range(60)]
    lines += ["    )", "    torch.save(model.state_dict(), total)", ""]
    (tmp_path / "train.py").write_bytes(("import torch\n" + "\r\n".join(lines)).encode())
    (tmp_path / "legacy.py").write_text(LEGACY, encoding="utf-8")
    for command in ("check", "fix"):
        result = _run(tmp_path, command, "--no-cache", ".", timeout=120)
        assert result.returncode in (0, 1), result.stderr
    assert (tmp_path / "legacy.py").read_text(encoding="utf-8") == FIXED
