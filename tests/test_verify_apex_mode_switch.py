"""Issue 12, at run time: a training function that also validates (rules/apex/_scalerless_calls.py).
The project tests/verify_projects/apex_mode_switch (written for these tests) runs `run_nn(mode, ...)`
to train after `amp.initialize` and, from `evaluate()`, with `mode="valid"` only. The safe fix passes
the scaler to the training calls and none to the validation call there (`scaler=None`): the migrated
program trains like the apex original and still runs its final validation."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_mode_switch"


def test_mode_switching_program_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_mode_switch")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "def run_nn(mode, model, loader, criterion=None, optim=None, apex=None, *, scaler=None):\n" in migrated
    assert '        return run_nn("valid", model, DataLoader(valid_set, batch_size=args.batch_size), criterion)\n' in migrated

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--apex")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    for side in ("before", "after"):
        for run in data["runs"][side]:
            # 3 epochs of 8 steps, under the budget of 30: each run goes to the end, `evaluate()` included
            assert run["status"] == "finished" and 20 <= run["steps"] <= 24, run
            assert run["written_files"] == ["model.pt"], run
    steps = {side: [run["steps"] for run in data["runs"][side]] for side in ("before", "after")}
    assert steps["before"] == steps["after"], steps  # a step skipped on overflow is skipped on both sides
    for run in data["runs"]["after"]:
        assert not run["apex_emulation"] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original
