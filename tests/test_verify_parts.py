"""Parts of `verify` that need no training run: the project copy, the write sandbox, the plot,
the lazy CLI entry."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampmigrate.config import Settings
from ampmigrate.verify.project import migrate_copy
from ampmigrate.verify.runner import TimeLimit
from ampmigrate.verify.sandbox import Sandbox
from ampmigrate.verify.termplot import line_chart

from conftest import ROOT

LEGACY = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n"


def snapshot(root: Path):
    """Every file under root (links included) with its bytes' hash."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            found[str(path.relative_to(root))] = (path.is_symlink(), hashlib.sha256(path.read_bytes()).hexdigest())
    return found


# ------------------------------------------------------------------------------ project copy
def test_migrated_copy_changes_the_copy_only(tmp_path):
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "data").mkdir()
    (project / ".git").mkdir()
    (project / "train.py").write_text("from pkg.model import Net\n" + LEGACY)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "model.py").write_text(LEGACY)
    (project / "pkg" / "config.yaml").write_text("lr: 0.1\n")
    (project / "data" / "train.csv").write_text("1,2\n")
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = snapshot(project)

    copy = migrate_copy(str(project), str(tmp_path / "copy"), Settings(root=str(project)))

    assert snapshot(project) == before
    assert sorted(copy.changed) == ["pkg/model.py", "train.py"]
    assert copy.fixed >= 2
    migrated = (tmp_path / "copy" / "pkg" / "model.py").read_text()
    assert "torch.cuda.amp" not in migrated and "autocast" in migrated
    # non-Python files are links to the originals; folders without Python are linked whole
    assert (tmp_path / "copy" / "pkg" / "config.yaml").is_symlink()
    assert (tmp_path / "copy" / "data").is_symlink()
    assert (tmp_path / "copy" / "data" / "train.csv").read_text() == "1,2\n"
    assert not (tmp_path / "copy" / ".git").exists()
    assert copy.in_copy(str(project / "train.py")) == str(tmp_path / "copy" / "train.py")


def test_a_linked_python_file_is_migrated_as_a_file_of_its_own(tmp_path):
    outside = tmp_path / "shared_model.py"
    outside.write_text(LEGACY)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(LEGACY)
    (project / "model.py").symlink_to(outside)

    copy = migrate_copy(str(project), str(tmp_path / "copy"), Settings(root=str(project)))

    assert outside.read_text() == LEGACY
    assert "model.py" in copy.changed
    assert not (tmp_path / "copy" / "model.py").is_symlink()
    assert "torch.cuda.amp" not in (tmp_path / "copy" / "model.py").read_text()


# ------------------------------------------------------------------------------ sandbox
@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "checkpoint.pt").write_text("the real checkpoint")
    (project / "log.txt").write_text("old log\n")
    monkeypatch.chdir(project)
    box = Sandbox([str(project)], str(tmp_path / "scratch"))
    box.install()
    yield project
    box.uninstall()


def test_sandbox_redirects_writes_and_reads_them_back(sandbox, tmp_path):
    with open("checkpoint.pt", "w") as handle:
        handle.write("a 200-step checkpoint")
    with open("checkpoint.pt") as handle:
        assert handle.read() == "a 200-step checkpoint"
    with open("log.txt", "a") as handle:  # append: extends a copy of the user's file
        handle.write("new line\n")
    with open("log.txt") as handle:
        assert handle.read() == "old log\nnew line\n"
    os.makedirs("runs/exp1", exist_ok=True)
    Path("runs/exp1/metrics.json").write_text("{}")
    assert os.path.isdir("runs/exp1") and os.path.exists("runs/exp1/metrics.json")
    os.replace("runs/exp1/metrics.json", "metrics.json")
    os.remove("checkpoint.pt")

    with open(tmp_path / "outside.txt", "w") as handle:  # not protected: written where asked
        handle.write("x")


def test_sandbox_leaves_the_users_files_alone(sandbox, tmp_path):
    before = snapshot(sandbox)
    with open("checkpoint.pt", "w") as handle:
        handle.write("overwritten?")
    os.makedirs("runs", exist_ok=True)
    os.rename("log.txt", "runs/log.txt")  # moving a user's file moves a copy
    os.unlink("checkpoint.pt")
    import shutil

    shutil.rmtree("runs")
    assert snapshot(sandbox) == before
    assert (tmp_path / "scratch").is_dir()


# ------------------------------------------------------------------------------ terminal plot
def test_line_chart_draws_every_series_with_its_style():
    chart = line_chart([("before", [3.0, 2.0, 1.0], "cyan"), ("after", [3.0, 2.1, 1.2], "magenta")], width=20, height=5)
    text = chart.plain
    lines = text.splitlines()
    assert lines[0].startswith("3 ┤")
    assert any(ch for ch in lines[0] if 0x2800 < ord(ch) <= 0x28FF)
    assert "step 3" in text and "before" in text and "after" in text
    styles = {str(span.style) for span in chart.spans}
    assert {"cyan", "magenta"} <= styles


def test_line_chart_survives_flat_and_non_finite_curves():
    text = line_chart([("flat", [1.0, 1.0, float("nan"), 1.0], "cyan")], width=10, height=3).plain
    assert "flat" in text
    assert line_chart([("empty", [], "cyan")]).plain == "(nothing to plot)"


# ------------------------------------------------------------------------------ the CLI entry
def test_the_verify_command_imports_no_torch():
    code = "import sys, ampmigrate.verify.command, ampmigrate.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_verify_is_listed_and_has_help(cli):
    listing = cli("--help")
    assert "verify" in listing.output
    shown = cli("verify", "--help")
    assert shown.exit_code == 0
    for option in ("--after", "--root", "--steps", "--seed", "--device", "--runs", "--tolerance", "--json", "--plot", "--isolation", "--clean"):
        assert option in shown.output


# ------------------------------------------------------------------------------ runs at a time
def test_runs_share_the_cores_and_report_their_steps_while_they_run(tmp_path, monkeypatch):
    import time

    from ampmigrate.verify import batch
    from ampmigrate.verify.runner import RunResult, RunSpec

    monkeypatch.setattr(batch, "cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # the user's own setting wins
    assert batch.plan_jobs(None, 8, "cpu") == 4 and batch.plan_jobs(None, 2, "cpu") == 2
    assert batch.plan_jobs(None, 8, "cuda") == 1 and batch.plan_jobs(3, 8, "cpu") == 3
    seen_env, lines = [], []

    def fake_execute(spec, workdir, name, limit=None, cancel=None):
        seen_env.append(spec.env)
        os.makedirs(os.path.join(workdir, "progress"), exist_ok=True)
        with open(os.path.join(workdir, "progress", name), "w") as handle:
            handle.write("7\n")
        time.sleep(1.2)  # the counter polls every 0.5 s
        return RunResult(spec, {"status": "completed"}, "", 0)

    monkeypatch.setattr(batch, "execute", fake_execute)
    specs = [(RunSpec(label=side, script="x.py", args=[], cwd=".", steps=20, seed=0, device="cpu", env={"A": "1"}), side)
             for side in ("before", "after")]
    results = batch.run_all(specs, str(tmp_path), jobs=2, limit=TimeLimit(), live=lines.append)
    assert [r.spec.label for r in results] == ["before", "after"]
    assert all(env["OMP_NUM_THREADS"] == "2" and "MKL_NUM_THREADS" not in env and env["A"] == "1" for env in seen_env)
    assert any("before seed 0: step 7/20" in line and "after seed 0: step 7/20" in line for line in lines), lines
