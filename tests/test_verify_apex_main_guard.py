"""Issue 12, at run time: a script whose settings exist only under `if __name__ == "__main__":`,
apex set up there with run-time options, the loss scaled in module-level functions called from
that block (cascade-stereo, TransMVSNet). The scaler is made inside the block
(rules/apex/_scaler_access.py `_only_run_in_arm`); it once went above the block and read `args`
before the block bound it (a NameError at start). The project tests/verify_projects/apex_main_guard
(written for these tests) trains like the original with `--using_apex --opt-level O1` and on the
default path."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_main_guard"


def _migrated(tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_main_guard")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    main = migrated.split('if __name__ == "__main__":\n')[1]
    assert "    scaler = torch.amp.GradScaler(\n" in main and "GradScaler" not in migrated.split('if __name__ == "__main__":\n')[0]
    return project, original


def test_the_main_block_setup_trains_like_the_original(cli, monkeypatch, tmp_path):
    project, original = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--using_apex", "--opt-level", "O1")
    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original


def test_the_default_fp32_path_still_runs(cli, monkeypatch, tmp_path):
    project, _ = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    for run in data["runs"]["after"]:
        assert run["status"] in ("finished", "completed") and run["error"] is None, run
