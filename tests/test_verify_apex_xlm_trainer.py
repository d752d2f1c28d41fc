"""Issue 12, at run time: the XLM trainer shape (tests/verify_projects/apex_xlm_trainer, written for
these tests): networks and optimizers in dicts, one loss scaled for a list of optimizers in
`optimize(loss)` with `delay_unscale` accumulation, a clip per optimizer in a loop over the names,
the steps in a loop, the forward pass in the method calling it, the opt level known at run time.
Migrated by the safe `fix` (rules/apex/_optimizer_loops.py, _delayed_micro_steps.py,
_caller_forward.py) and verified against the apex original on the emulation.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_xlm_trainer"


def test_the_xlm_trainer_migrated_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_xlm_trainer")
    original = (project / "train.py").read_text(encoding="utf-8")
    assert "apex.amp.scale_loss(loss, optimizers)" in original and "import apex\n" in original

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == ["train.py"]
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original
