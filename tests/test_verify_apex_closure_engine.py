"""Issue 12, at run time: an ignite-style trainer factory whose update function, a closure, scales
the loss with apex (rules/apex/_scaler_access.py: the scaler is passed to the factory, and the
closure captures it). The project tests/verify_projects/apex_closure_engine (written for these
tests) sets apex up under `if fp16:` in `main()` and steps every second iteration; the migrated
program trains like the apex original, and the fp32 path is untouched."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_closure_engine"


def test_closure_of_a_trainer_factory_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_closure_engine")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "fp16=False, *, scaler):" in migrated and "fp16=fp16, scaler=scaler," in migrated
    assert "            y_pred = model(x)\n            loss = loss_fn(y_pred, y)\n" in migrated  # under autocast

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16"
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
