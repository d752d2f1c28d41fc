"""Issue 12, at run time: apex set up in a script, the loss scaled in another file's epoch
function that the script reaches through `fit()` (the scaler threads through both,
engine/apex_threading.py `_relay`), twice per step: an FGSM input gradient taken from apex's
scaled loss (`torch.autograd.grad(scaled_loss, delta)`, divided back by the scale) and the
training backward, whose scaled loss is also logged. Both bodies use the scaled loss for more
than its backward: `scaled_loss = scaler.scale(loss)` binds it. The project
tests/verify_projects/apex_adversarial_relay (written for these tests) trains like the original."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_adversarial_relay"


def _project_fix(project):
    """Both files through `ampmigrate fix`, which sees the project (the split setup is one group)."""
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--exit-zero", "."],
        cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    return {name: (project / name).read_text(encoding="utf-8") for name in ("train.py", "engine.py")}


def test_the_relayed_adversarial_training_trains_like_the_original(cli, monkeypatch, tmp_path):
    fixed = copy_of(PROJECT, tmp_path / "fixed")
    originals = {name: (fixed / name).read_text(encoding="utf-8") for name in ("train.py", "engine.py")}
    migrated = _project_fix(fixed)
    for name, text in migrated.items():
        compile(text, name, "exec")
        assert _apex_amp_uses(originals[name]) and _apex_amp_uses(text) == []
    engine = migrated["engine.py"]
    assert engine.count("        scaled_loss = scaler.scale(loss)\n") == 2
    assert "        train_one_epoch(model, optimizer, loader, device, eps, scaler=scaler)\n" in engine
    project = copy_of(PROJECT, tmp_path / "apex_adversarial_relay")
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--opt-level", "O1")
    assert_trains_like_the_apex_original(result, data)
    assert sorted(data["migration"]["changed_files"]) == ["engine.py", "train.py"]
    assert {name: (project / name).read_text(encoding="utf-8") for name in originals} == originals
