"""Issue 12, at run time: the CycleGAN/pix2pix template, whose model class computes its losses in
methods (`self.forward()`, then `self.backward_D()` / `self.backward_G()` storing `self.loss_D` /
`self.loss_G`) before scaling them (rules/apex/_regions.py follows the calls into those methods for
the autocast regions). The project tests/verify_projects/apex_gan_loss_methods (written for these
tests) sets both networks up in one `amp.initialize` with `num_losses=2`; the migrated program, with
one GradScaler, trains like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_gan_loss_methods"


def test_gan_with_losses_computed_in_methods_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_gan_loss_methods")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "        with torch.autocast(\"cuda\", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n            self.forward()\n" in migrated

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16"
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
