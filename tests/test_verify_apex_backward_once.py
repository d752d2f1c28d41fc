"""Issue 12, at run time: a module-level backward helper called once by the function that steps,
and `amp.initialize` in the two arms of `if model_old is not None:` (the models with and without
the optional old one). The project tests/verify_projects/apex_backward_once (written for these
tests) keeps that shape: `backward(loss, optimizer, fp16)` scales the loss, `train_epoch()` runs
the forward pass, clips `amp.master_params(optimizer)` and steps. The safe fix makes one GradScaler
before the arms, passes it to both functions and puts autocast around the forward pass in
`train_epoch()`: the migrated program, run with the old model (the arm listing both models), trains
like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_backward_once"


def test_backward_helper_called_once_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_backward_once")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "def backward(loss, optimizer, fp16=False, *, scaler):\n" in migrated
    assert "        backward(loss, optimizer, args.fp16, scaler=scaler)\n        scaler.unscale_(optimizer)\n" in migrated
    assert '        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n            logits = model(x)\n' in migrated
    assert migrated.count("torch.amp.GradScaler(") == 1

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16", "--distill"
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
