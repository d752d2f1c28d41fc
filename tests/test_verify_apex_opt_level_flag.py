"""Issue 12, at run time: apex's opt level given as a string option, empty for fp32 (HF's
transfer-learning-conv-ai and its descendants): `if args.fp16:` tests the string. The scaler's
`enabled=` becomes `bool(args.fp16) and args.fp16 != "O0"` (rules/apex/_scaler_access.py
`_as_bools`): `args.fp16 and ...` would hand `""` to `torch.autocast(enabled=...)`, which
raises on the default fp32 path. The project tests/verify_projects/apex_opt_level_flag (written for
these tests) trains like the original with `--fp16 O1` and on the default path."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_opt_level_flag"


def _migrated(tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_opt_level_flag")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert 'enabled=bool(args.fp16) and args.fp16 != "O0"' in migrated
    return project, original


def test_the_opt_level_string_trains_like_the_original(cli, monkeypatch, tmp_path):
    project, original = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--fp16", "O1")
    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original


def test_the_default_fp32_path_still_runs(cli, monkeypatch, tmp_path):
    project, _ = _migrated(tmp_path)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    for run in data["runs"]["after"]:
        assert run["status"] in ("finished", "completed") and run["error"] is None, run
