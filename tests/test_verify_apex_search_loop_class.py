"""Issue 12, at run time: apex set up at each iteration of a search loop in a trainer method, the
loss scaled in another method (dvl-tum's intra_batch and GHOST), under an int flag (`is_apex: 0`
in YAML, `--is_apex 1`). The scaler becomes `self.scaler`, made at each iteration where
`amp.initialize` was (rules/apex/_init_enclosure.py `_attribute_per_iteration`), with a disabled
default in `__init__`, and its `enabled=` is `bool(...)` of the flag (analysis/bool_flags.py):
`torch.autocast(enabled=self.scaler.is_enabled())` raises on an int. The project
tests/verify_projects/apex_search_loop_class (written for these tests) trains like the original
with `--is_apex 1` and on the default path."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_search_loop_class"


def _migrated(tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_search_loop_class")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert '            self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.config["is_apex"]))\n' in migrated
    assert '        self.scaler = torch.amp.GradScaler("cuda", enabled=False)\n' in migrated
    return project, original


def test_the_search_loop_trains_like_the_original(cli, monkeypatch, tmp_path):
    project, original = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--is_apex", "1")
    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original


def test_the_int_flag_off_still_runs(cli, monkeypatch, tmp_path):
    project, _ = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    for run in data["runs"]["after"]:
        assert run["status"] in ("finished", "completed") and run["error"] is None, run
