"""Issue 12, at run time: the k-fold loop shape (rules/apex/_init_enclosure.py). The project
tests/verify_projects/apex_kfold (written for these tests) calls `amp.initialize` in a fold loop
with a new model and optimizer per fold; the safe fix makes a new GradScaler per fold. The
harness counts the steps of the first optimizer that steps (fold 0's), so the curves compared
are fold 0's; the runs then go on to the end of the script, and each writes every fold's
checkpoint: the later folds ran too, before on the apex emulation and after without apex.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_kfold"


def test_kfold_program_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_kfold")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    fold_loop = migrated.split("for fold in range(args.folds):\n", 1)[1]
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)' in fold_loop  # one per fold

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "60", "--runs", "2", "--", "--fp16")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == ["train.py"]
    for side in ("before", "after"):
        for run in data["runs"][side]:
            # fold 0's 20 steps are counted; the script then ran to its end, through every fold
            assert run["status"] == "finished" and run["steps"] == 20, run
            assert run["written_files"] == ["fold0.pt", "fold1.pt", "fold2.pt"], run
    for run in data["runs"]["before"]:
        assert "apex.amp" in run["apex_emulation"] and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert not run["apex_emulation"] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original
