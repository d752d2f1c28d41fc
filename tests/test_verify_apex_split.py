"""Issue 12, at run time: an apex setup split across two files (maskrcnn-benchmark's
tools/train_net.py + engine/trainer.py, reduced to a CPU-sized detector in
tests/verify_projects/apex_split_trainer, with a learning-rate helper beside the step function and
`amp.state_dict()` saved in the setup's checkpoint), migrated by the safe `fix` on both files at once
(rules/apex/_cross_threading.py) and verified against the apex original on the emulation.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_split_trainer"


def test_the_split_setup_migrated_on_both_sides_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_split_trainer")
    originals = {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")}
    assert all(_apex_amp_uses(text) for text in originals.values()), "both files use apex.amp"

    result, data = run_verify(cli, monkeypatch, project, "train_net.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert sorted(data["migration"]["changed_files"]) == ["train_net.py", "trainer.py"]  # both sides, together
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    # the checkpoint with apex's state (the GradScaler's after the migration) went to the run's scratch
    for side in ("before", "after"):
        assert data["runs"][side][0]["written_files"] == ["output/epoch_0.pth", "output/epoch_1.pth"]
    diff = cli("fix", "--diff", "--no-cache", str(project)).output  # what verify ran as the after
    assert '"amp": scaler.state_dict()' in diff and "+    adjust_lr(" not in diff
    assert {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")} == originals
