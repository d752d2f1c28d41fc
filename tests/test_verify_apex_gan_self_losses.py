"""Issue 12, at run time: a GAN trainer that keeps its losses on itself (`self.loss_gen_total`), as
DG-Net's does (rules/apex/_regions.py follows instance attributes in the loss's backward slice).
The project tests/verify_projects/apex_gan_self_losses (written for these tests) updates the
discriminator and the generator each iteration, each set up by its own `amp.initialize`; the
migrated program, with one GradScaler, trains like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_gan_self_losses"


def test_gan_with_losses_on_the_trainer_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_gan_self_losses")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert "            self.loss_gen_total = weights" in migrated  # inside the autocast region

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16"
    )

    assert_trains_like_the_apex_original(result, data)
    assert (project / "train.py").read_text(encoding="utf-8") == original
