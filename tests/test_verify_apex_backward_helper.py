"""Issue 12, at run time: a module-level backward helper bound with `functools.partial`
(rules/apex/_helper_calls.py). The project tests/verify_projects/apex_backward_helper (written for
these tests) keeps lucidrains' shape: `loss_backwards(fp16, loss, optimizer)` scales the loss, the
trainer's `train()` runs the forward pass, accumulates and steps. The safe fix passes the scaler
through the partial and steps through it in `train()`: the migrated program trains like the apex
original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_backward_helper"


def test_backward_helper_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_backward_helper")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "        backwards = partial(loss_backwards, self.fp16, scaler=self.scaler)\n" in migrated
    assert "def loss_backwards(fp16, loss, optimizer, *, scaler, **kwargs):\n" in migrated

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    steps = {side: [run["steps"] for run in data["runs"][side]] for side in ("before", "after")}
    assert steps["before"] == steps["after"], steps
    for run in data["runs"]["after"]:
        assert not run["apex_emulation"] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original
