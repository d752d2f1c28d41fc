"""Issue 12, at run time: a scaled backward in both arms of an `if` (chunked or whole batches, each
with its fp32 path) and one step after them (rules/apex/_amp_steps.py `_chooses_backward`), and a
clip of the model's parameters in the `else` of `if <opt level> == "O2"` (O2 cannot reach it, so
the fix is safe). The project tests/verify_projects/apex_chunked_backward (written for these tests)
trains both ways; before this fix the step went through the scaler only in the chunked arm, so an
unchunked fp16 run stepped with scaled gradients."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_chunked_backward"


@pytest.mark.parametrize("chunks", ["1", "2"])
def test_scaled_backward_in_both_arms_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path, chunks):
    project = copy_of(PROJECT, tmp_path / "apex_chunked_backward")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "        scaler.step(optimizer)\n        scaler.update()\n" in migrated and "optimizer.step()" not in migrated

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2",
        "--", "--fp16", "O1", "--batch-chunk", chunks,
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
