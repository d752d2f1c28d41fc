"""Issue 12, at run time: apex's amp module carried on the argument namespace
(tests/verify_projects/apex_uer_carrier, written for these tests, after UER-py): `args.amp = amp`
in `worker()`, `args.amp.scale_loss(...)` in a trainer method picked from a dict, accumulation.
Migrated by the safe `fix` (rules/apex/_amp_carrier.py) and verified against the apex original on
the emulation, with fp16 and on the fp32 path, where the migrated code must not reach for a scaler
that was never made."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_uer_carrier"


def test_the_carried_scaler_trains_like_apex(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_uer_carrier")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "args.amp_scaler = scaler" in migrated and "args.amp." not in migrated.split('"""', 2)[2]

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "20", "--runs", "2", "--", "--fp16")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original


def test_the_fp32_path_of_the_migration_runs_without_the_scaler(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_uer_carrier")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "20", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent"
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["precision"] == "fp32", run
