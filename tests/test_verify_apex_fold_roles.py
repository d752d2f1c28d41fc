"""Issue 12, at run time: a fold loop whose optimizer is chosen by an `if`/`elif` with no `else`
and optimizers kept in a dict by role (`scaler.step(optimizers["net"])`). The project
tests/verify_projects/apex_fold_roles (written for these tests) keeps both shapes; the safe fix makes
one GradScaler per fold where `amp.initialize` was and steps each optimizer of the dict through it:
the migrated program trains like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_fold_roles"


def test_fold_loop_with_optimizers_by_role_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_fold_roles")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert '        scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n' in migrated
    assert '        scaler.step(optimizers["net"])\n        scaler.step(optimizers["center"])\n        scaler.update()\n' in migrated

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16", "--optim", "adam"
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
