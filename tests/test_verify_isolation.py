"""`verify` touches nothing of the user's, leaves no process or folder behind, and runs the
script shapes people have.

- the leak suite: tests/verify_projects/leaky/train.py writes by every route we know (truncate
  in place, numpy, pandas when installed, torch.save through a folder linked out of the project,
  os.open/os.write, a child process, shutil.copy2/copytree, os.symlink, a logging handler,
  DataLoader workers with fork and spawn); it runs under `verify` with each isolation mode this
  machine supports, and every file of the project, the working directory and the link's target
  must be byte for byte as before, with nothing created there, and every run must complete;
- processes and folders: SIGINT, SIGTERM, SIGHUP to verify and verify's own death (SIGKILL)
  leave no run or child process; the time limits stop a run that never steps or stalls;
  `verify --clean`;
- script shapes: tests/verify_projects/script_shapes/ (legacy tensor types, torchrun-style DDP,
  cuDNN flags) verify end to end on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")

from ampmigrate.verify import isolation  # noqa: E402
from ampmigrate.verify.runner import RunResult, RunSpec, TimeLimit, execute, time_limit  # noqa: E402

PROJECTS = ROOT / "tests" / "verify_projects"
NAMESPACE_MISSING = isolation.unavailable_reason()
MODES = [
    pytest.param("namespace", marks=pytest.mark.skipif(NAMESPACE_MISSING is not None, reason=f"no namespaces: {NAMESPACE_MISSING}")),
    "redirect",
]


@pytest.fixture(autouse=True)
def quiet_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    scratch = tmp_path / "verify-tmp"  # verify's own folders: must be gone afterwards
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def tree_state(*roots: Path):
    """Every entry under the roots: links by target, files by mode and hash, folders by mode."""
    state = {}
    for root in roots:
        for directory, subdirectories, files in os.walk(root):
            for name in subdirectories + files:
                path = Path(directory, name)
                info = path.lstat()
                if path.is_symlink():
                    state[str(path)] = ("link", os.readlink(path))
                elif path.is_dir():
                    state[str(path)] = ("dir", info.st_mode)
                else:
                    state[str(path)] = ("file", info.st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    return state


def leaky_world(base: Path):
    """The leaky project, a separate working directory with the user's files, and a folder
    outside both that the working directory links to (`ckpt -> outside`)."""
    project, cwd, outside = base / "project", base / "cwd", base / "outside"
    project.mkdir(parents=True)
    shutil.copy(PROJECTS / "leaky" / "train.py", project / "train.py")
    (cwd / "data").mkdir(parents=True)
    (cwd / "config.json").write_text('{"lr": 0.1, "epochs": 3}\n')
    (cwd / "notes.txt").write_text("the user's notes\n")
    (cwd / "data" / "train.csv").write_text("1,2\n3,4\n")
    outside.mkdir()
    (outside / "last.pt").write_bytes(b"the user's real checkpoint")
    (cwd / "ckpt").symlink_to(outside, target_is_directory=True)
    return project, cwd, outside


def verify_args(script: Path, mode: str, report: Path, *script_args: str):
    return ["verify", str(script), "--device", "cpu", "--isolation", mode, "--steps", "20", "--runs", "2",
            "--json", str(report), "--", *script_args]


# ------------------------------------------------------------------------------ the leak suite
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_leak_suite(mode, cli, monkeypatch, tmp_path, quiet_runs):
    base = tmp_path / "world"
    project, cwd, outside = leaky_world(base)
    before = tree_state(base)
    # Child processes are beyond what the redirection inside Python can catch (the note says so).
    skip = [] if mode == "namespace" else ["child"]
    monkeypatch.chdir(cwd)
    report = tmp_path / "report.json"

    result = cli(*verify_args(project / "train.py", mode, report, "--skip", *skip))

    assert result.exit_code == 0, result.output
    assert tree_state(base) == before  # nothing changed, nothing created, no link added
    data = json.loads(report.read_text())
    assert data["isolation"] == mode
    runs = [run for side in data["runs"].values() for run in side]
    assert len(data["runs"]["before"]) == len(data["runs"]["after"]) == 2  # --runs 2 on each side
    assert [run["status"] for run in runs] == ["completed"] * len(runs)  # the script ran without error
    written = set(data["runs"]["before"][0]["written_files"])
    assert {"config.json", "notes.txt", "runs/arr.txt", "link_to_config", "train.log", "data_copy/train.csv"} <= written
    assert written & {"ckpt/last.pt", "../outside/last.pt"}  # through the link, into scratch
    if mode == "namespace":
        assert {"created_by_child.txt", "worker-fork-0.txt", "worker-spawn-0.txt"} <= written
        assert "isolation namespace" in " ".join(result.output.split())  # the title line may wrap
    else:
        assert any("cannot catch writes from child processes" in note for note in data["notes"])
        assert "cannot catch writes from child processes" in " ".join(result.output.split())
    assert os.listdir(quiet_runs) == []  # equivalent: the verify folder is gone


@pytest.mark.skipif(NAMESPACE_MISSING is not None, reason=f"no namespaces: {NAMESPACE_MISSING}")
def test_a_write_outside_the_overlays_fails_and_says_why(tmp_path):
    """Folders that hold none of the project, the working directory, the temporary folder or the
    home directory are read-only in the run (here: this repository's own tests folder)."""
    target = ROOT / "tests" / f"_written_by_a_run_{uuid.uuid4().hex}.txt"
    project = tmp_path / "project"
    project.mkdir()
    (project / "write.py").write_text("import sys\nopen(sys.argv[1], 'w').write('leaked')\n")
    spec = RunSpec(label="before", script=str(project / "write.py"), args=[str(target)], cwd=str(project), steps=10, seed=0,
                   device="cpu", protect=[str(project)], isolation="namespace")
    try:
        result = execute(spec, str(tmp_path / "work"), "before")
        assert not target.exists()
        assert result.status == "crashed"
        assert "Read-only file system" in result.error["message"]
        assert "the rest of the file system is read-only" in result.error["message"]
    finally:
        if target.exists():
            target.unlink()


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PROBE = "import subprocess, sys, torch, ampmigrate; subprocess.run([sys.executable, '-c', 'import torch'], check=True)"


def _python_for_nobody():
    """An interpreter of this version that `nobody` may run, with this one's packages on its path
    (a pyenv interpreter under root's home is not), and the environment it needs; or None."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        return None
    import site
    import sysconfig

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"], *site.getsitepackages()])
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(candidate):
            continue
        probe = subprocess.run(NOBODY + [candidate, "-c", PROBE], env=dict(os.environ, PYTHONPATH=path),
                               capture_output=True, timeout=120)
        if probe.returncode == 0:
            return candidate, path
    return None


@pytest.mark.slow
@pytest.mark.skipif(NAMESPACE_MISSING is not None, reason=f"no namespaces: {NAMESPACE_MISSING}")
def test_leak_suite_as_an_unprivileged_user():
    """What real users have: no privileges at all, only an unprivileged user namespace."""
    found = _python_for_nobody()
    if found is None:
        pytest.skip("needs root, setpriv and a Python with torch that the user nobody may run")
    python, python_path = found
    base = Path(tempfile.mkdtemp(prefix="ampmigrate-nobody-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        project, cwd, outside = leaky_world(base / "world")
        other_users_file = cwd / "shared.txt"  # root's, writable by all: an overlay cannot copy it up
        (project / "write_shared.py").write_text('open("shared.txt", "a").write("x")\n')
        for folder in ("home", "tmp"):
            (base / folder).mkdir()
        subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
        other_users_file.write_text("root's file\n")
        other_users_file.chmod(0o666)
        before = tree_state(base / "world")
        env = dict(os.environ, PYTHONPATH=python_path, HOME=str(base / "home"), TMPDIR=str(base / "tmp"), OMP_NUM_THREADS="1")
        nobody = NOBODY + [python, "-m", "ampmigrate"]

        completed = subprocess.run(
            nobody + verify_args(project / "train.py", "namespace", base / "tmp" / "report.json"),
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
        data = json.loads((base / "tmp" / "report.json").read_text())
        runs = [run for side in data["runs"].values() for run in side]
        assert len(runs) >= 4 and {run["status"] for run in runs} == {"completed"}
        assert all("created_by_child.txt" in run["written_files"] for run in data["runs"]["before"])
        assert tree_state(base / "world") == before
        # removed by the unprivileged verify itself, overlay work folders (mode 000) included
        assert not [name for name in os.listdir(base / "tmp") if name.startswith("ampmigrate-verify-")]

        # A file of another user cannot be copied into the run's layer: the write fails, and says why.
        completed = subprocess.run(
            nobody + ["verify", str(project / "write_shared.py"), "--device", "cpu", "--isolation", "namespace", "--steps", "20"],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        )
        assert completed.returncode == 2, completed.stdout + completed.stderr
        assert "belongs to another user" in " ".join(completed.stdout.split())
        assert tree_state(base / "world") == before
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_without_namespaces_auto_falls_back_with_a_warning_and_namespace_refuses(monkeypatch):
    monkeypatch.setattr(isolation, "_PROBED", {"reason": "unshare: Operation not permitted"})
    notes = []
    assert isolation.choose_isolation("auto", notes) == "redirect"
    assert "not isolated by namespaces here (unshare: Operation not permitted)" in notes[0]
    assert "cannot catch writes from child processes" in notes[0]
    with pytest.raises(ValueError, match="--isolation namespace is not available here: unshare"):
        isolation.choose_isolation("namespace", [])
    monkeypatch.setattr(isolation, "_PROBED", {"reason": None})
    assert isolation.choose_isolation("auto", []) == "namespace"


def test_namespace_plan_overlays_outermost_folders_and_never_the_root(tmp_path):
    (tmp_path / "project" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "project" / "sub" / "out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "project" / "everything").symlink_to("/")
    workdir = tmp_path / "work"
    workdir.mkdir()

    targets = isolation.overlay_targets([str(tmp_path / "project"), str(tmp_path / "project" / "sub")], str(workdir))

    assert "/" not in targets
    assert not any(t.startswith(str(workdir)) for t in targets)
    covered = lambda path: any(path == t or path.startswith(t + os.sep) for t in targets)  # noqa: E731
    assert covered(str(tmp_path / "project" / "sub")) and covered(str(tmp_path / "elsewhere"))
    assert len(targets) == len(set(targets)) and not any(a != b and a.startswith(b + os.sep) for a in targets for b in targets)


# ------------------------------------------------------------------------------ processes and folders
HANGING = '''
    import subprocess, sys, time
    import torch

    marker = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    (weight * 2).sum().backward()
    optimizer.step()
    print("stepped", flush=True)
    time.sleep(600)
'''


def processes_with(marker: str):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                arguments = handle.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in arguments:
            found.append(int(pid))
    return found


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"])
def test_no_process_outlives_verify(how, tmp_path, quiet_runs):
    project = tmp_path / "project"
    project.mkdir()
    (project / "hang.py").write_text(textwrap.dedent(HANGING))
    marker = f"ampmigrate-test-{uuid.uuid4().hex}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(quiet_runs), OMP_NUM_THREADS="1")
    verify = subprocess.Popen(
        [sys.executable, "-m", "ampmigrate", "verify", "hang.py", "--device", "cpu", "--steps", "20", "--", marker],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # A suite started in the background (`nohup ... &`) inherits SIGINT ignored, and so would
        # verify: give it the default disposition a user's terminal gives it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # (the marker is in verify's own command line too: look for the run's child)
        assert wait_until(lambda: set(processes_with(marker)) - {verify.pid}, 180), "the run's child never started"
        verify.send_signal(getattr(signal, how))
        verify.wait(timeout=60)
        assert wait_until(lambda: not processes_with(marker), 10), f"left running after {how}: {processes_with(marker)}"
        if how == "SIGKILL":  # verify could not clean up after itself; --clean does
            assert len(os.listdir(quiet_runs)) == 1
            cleaned = subprocess.run([sys.executable, "-m", "ampmigrate", "verify", "--clean"], env=env, capture_output=True, text=True, timeout=60)
            assert "removed 1 verify folder(s)" in cleaned.stdout, cleaned.stdout + cleaned.stderr
        assert os.listdir(quiet_runs) == []
    finally:
        if verify.poll() is None:
            verify.kill()
        verify.wait()
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_cancel_kills_a_run_a_worker_thread_waits_on(tmp_path):
    """batch.run_all's workers wait on runs; an interrupted main thread sets `cancel` and each
    worker must kill its run's process group (the run and its child) and stop waiting."""
    import threading

    from ampmigrate.verify.runner import RunCancelled

    project = tmp_path / "project"
    project.mkdir()
    (project / "hang.py").write_text(textwrap.dedent(HANGING))
    marker = f"ampmigrate-test-{uuid.uuid4().hex}"
    spec = RunSpec(label="before", script=str(project / "hang.py"), args=[marker], cwd=str(project), steps=20, seed=0, device="cpu")
    cancel, raised = threading.Event(), []

    def wait_on_the_run():
        try:
            execute(spec, str(tmp_path / "work"), "before", limit=TimeLimit(total=300), cancel=cancel)
        except RunCancelled as exc:
            raised.append(exc)

    worker = threading.Thread(target=wait_on_the_run)
    worker.start()
    try:
        assert wait_until(lambda: processes_with(marker), 120), "the run's child never started"
        cancel.set()
        worker.join(timeout=10)
        assert not worker.is_alive() and raised
        assert wait_until(lambda: not processes_with(marker), 10), processes_with(marker)
    finally:
        cancel.set()
        worker.join()
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_clean_removes_folders_no_running_verify_owns(cli, tmp_path, quiet_runs):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        folders = {}
        for name, owner in (("live", sleeper.pid), ("dead", dead.pid), ("unowned", None)):
            folder = quiet_runs / f"ampmigrate-verify-{name}"
            (folder / "scratch" / "overlay" / "0" / "work" / "work").mkdir(parents=True)
            (folder / "scratch" / "overlay" / "0" / "work" / "work").chmod(0)  # as overlayfs leaves it
            if owner is not None:
                (folder / "owner.pid").write_text(str(owner))
            folders[name] = folder
        (quiet_runs / "someone-elses-folder").mkdir()

        result = cli("verify", "--clean")

        assert result.exit_code == 0, result.output
        assert "removed 2 verify folder(s); 1 in use by a running verify left alone" in result.output
        assert sorted(os.listdir(quiet_runs)) == ["ampmigrate-verify-live", "someone-elses-folder"]
    finally:
        sleeper.kill()
        sleeper.wait()


NEVER_STEPS = '''
    import subprocess, sys, time
    import torch

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    if sys.argv[2] == "stall":
        (weight * 2).sum().backward()
        optimizer.step()
    time.sleep(600)
'''


@pytest.mark.parametrize("kind", ["first", "stall"])
def test_time_limits_stop_a_run_that_does_not_step(kind, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "slow.py").write_text(textwrap.dedent(NEVER_STEPS))
    marker = f"ampmigrate-test-{uuid.uuid4().hex}"
    spec = RunSpec(label="before", script=str(project / "slow.py"), args=[marker, kind], cwd=str(project), steps=10, seed=0, device="cpu", protect=[str(project)])
    limit = TimeLimit(first_step=20.0, stall=None) if kind == "first" else TimeLimit(first_step=120.0, stall=2.0)

    result = execute(spec, str(tmp_path / "work"), "before", limit=limit)

    assert result.status == "timeout"
    expected = "no optimizer step within 20 s" if kind == "first" else "no optimizer step for 2 s after step 1"
    assert expected in result.error["message"]
    assert wait_until(lambda: not processes_with(marker), 10)  # the run's child went with it


def test_default_time_limits_come_from_the_baseline():
    assert time_limit(30.0) == TimeLimit(total=30.0)
    first = time_limit(None)
    assert first.total is None and first.first_step and first.stall  # no baseline yet: no endless wait either
    baseline = RunResult(RunSpec("before", "train.py", [], ".", 100, 0, "cpu"), {"run_seconds": 40.0}, "", 0)
    assert time_limit(None, baseline) == TimeLimit(total=320)  # 5 x its own 40 s, + 2 minutes
    assert time_limit(10.0, baseline) == TimeLimit(total=10.0)


# ------------------------------------------------------------------------------ script shapes
def reached_a_verdict(result, report: Path) -> bool:
    """The shape ran end to end: every run completed and the curves were compared (equivalent or
    not: how strict the comparison is, is the statistics' business, not the shape's)."""
    if result.exit_code not in (0, 1) or not report.exists():
        return False
    data = json.loads(report.read_text())
    return data["comparison"] is not None and data["verdict"] in ("equivalent", "not equivalent")


@pytest.mark.slow
@pytest.mark.parametrize("script", ["legacy_types.py", "ddp_torchrun.py", "cudnn_flags.py"])
def test_script_shapes_verify_on_the_cpu(script, cli, monkeypatch, tmp_path):
    project = tmp_path / "script_shapes"
    shutil.copytree(PROJECTS / "script_shapes", project)
    before = tree_state(project)
    monkeypatch.chdir(project)
    report = tmp_path / "report.json"

    result = cli("verify", script, "--device", "cpu", "--steps", "20", "--runs", "2", "--json", str(report))

    assert reached_a_verdict(result, report), result.output
    data = json.loads(report.read_text())
    assert script in data["migration"]["changed_files"]  # legacy AMP in it was migrated
    runs = [run for side in data["runs"].values() for run in side]
    assert len(runs) >= 4 and {run["status"] for run in runs} == {"completed"}
    assert all(run["precision"].startswith("fp16") for run in data["runs"]["before"])
    assert tree_state(project) == before


FRAMEWORKS = {"lightning_fit.py": "pytorch_lightning", "hf_trainer.py": "transformers"}
STEPS = "30"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FRAMEWORKS))
def test_framework_training_loops_verify_on_the_cpu(script, cli, monkeypatch, tmp_path):
    """Lightning's Trainer.fit and Hugging Face's Trainer.train: their optimizers' steps and
    losses (scaled by their own GradScaler) are observed like a hand-written loop's."""
    import importlib.util

    if importlib.util.find_spec(FRAMEWORKS[script]) is None:
        pytest.skip(f"{FRAMEWORKS[script]} is not installed")
    project = tmp_path / "frameworks"
    shutil.copytree(PROJECTS / "frameworks", project)
    before = tree_state(project)
    monkeypatch.chdir(project)
    report = tmp_path / "report.json"

    result = cli("verify", script, "--device", "cpu", "--steps", STEPS, "--runs", "2", "--json", str(report))

    assert reached_a_verdict(result, report), result.output
    data = json.loads(report.read_text())
    for run in data["runs"]["before"] + data["runs"]["after"]:
        assert run["status"] == "completed" and run["steps"] == int(STEPS)
        assert all(loss is not None and loss > 0 for loss in run["losses"])
    assert {run["precision"] for run in data["runs"]["before"]} == {"fp16 + GradScaler"}  # the framework's own scaler, seen
    assert {run["precision"] for run in data["runs"]["after"]} == {"bf16"}  # migrated (precision="bf16-mixed" / bf16=True)
    assert tree_state(project) == before
