"""Issue 12, at run time: a timm-style training script (tests/verify_projects/apex_timm_scaler),
whose apex arm (`amp.initialize` + timm's `ApexScaler()`) the safe fix turns into the native arm
(timm's `NativeScaler()` + the autocast variable bound to fp16 `torch.autocast`,
rules/apex/_timm_scaler.py), verified against the apex original on the emulation.

timm is not installed where the tests run, so the project carries a stand-in `timm` package
(ApexScaler and NativeScaler written after timm's documented behaviour, apex imported only where
ApexScaler runs). The migration resolves `timm.utils.ApexScaler` by the same qualified name as in
a real timm-based repository; the stand-in itself (apex inside a library) keeps its findings.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_apex_trainers import _max_relative_difference
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_timm_scaler"


def test_the_timm_apex_arm_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_timm_scaler")
    original = (project / "train.py").read_text(encoding="utf-8")
    assert _apex_amp_uses(original), "the project is an apex program"
    fixed = _safe_fix(project)["train.py"]
    compile(fixed, "train.py", "exec")
    assert _apex_amp_uses(fixed) == []
    code = fixed.split('"""', 2)[2]  # past the docstring, which tells the apex arm
    assert "loss_scaler = NativeScaler()" in code and "ApexScaler" not in code
    assert 'amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)' in fixed
    # the clip leaves the head out under AGC, where ApexScaler clipped it: that configuration raises
    assert 'if args.clip_grad is not None and ("agc" in args.clip_mode):\n            raise ValueError(' in fixed

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--apex-amp")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == ["train.py"]
    left = [f for f in data["migration"]["remaining_findings"] if "train.py" in f]
    assert [f for f in left if f.rsplit(" ", 1)[-1].startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and "apex.amp" in run["apex_emulation"]
        assert run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == []
        assert run["precision"] == "fp16 + GradScaler"
        assert run["clips_on_scaled_gradients"] == 0
    # the same numerics: fp16 autocast and a 2**16 loss scale on both sides, the clip on true gradients
    assert _max_relative_difference(data) < 1e-3, _max_relative_difference(data)
    assert (project / "train.py").read_text(encoding="utf-8") == original


def test_the_migration_with_the_apex_arm_left_in_fp32_runs_without_autocast(cli, monkeypatch, tmp_path):
    """A control for the precision check above: the scaler swapped but the autocast variable left
    as `suppress` runs the forward pass in fp32 where apex's O1 ran fp16. On this tiny model the
    losses cannot tell the two apart (the verdict may well be "equivalent"); the precision the
    after runs report does."""
    project = copy_of(PROJECT, tmp_path / "apex_timm_scaler")
    migrated = _safe_fix(project)["train.py"]
    bind = '        amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)\n'
    assert migrated.count(bind) == 1
    (project / "fp32_forward.py").write_text(migrated.replace(bind, ""), encoding="utf-8")

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--after", "fp32_forward.py", "--steps", "30", "--runs", "2", "--", "--apex-amp"
    )

    assert data is not None, result.output
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["precision"] != "fp16 + GradScaler", run["precision"]
