"""Issue 12, at run time: an estimator class set up with apex in `__init__` (its `enabled` chosen
inside the `if use_amp:` arm: the scaler is made there, a disabled one in a new `else:`) whose
`loss_gradient()` scales a loss only for its input's gradient (rules/apex/_class_input_gradient.py).
The project tests/verify_projects/apex_estimator_input_gradient (written for these tests) trains on
FGSM inputs from that gradient; the migrated estimator trains like the original on the apex
emulation, with apex's static loss scale of 1.0 kept."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_estimator_input_gradient"


def test_the_estimator_with_an_input_gradient_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_estimator_input_gradient")
    originals = {name: (project / name).read_text(encoding="utf-8") for name in ("train.py", "estimator.py")}
    assert _apex_amp_uses(originals["estimator.py"])
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--opt-level", "O1")
    assert_trains_like_the_apex_original(result, data)
    # every apex.amp site migrated, the input gradient's included
    assert data["migration"]["changed_files"] == {"estimator.py": 6}
    assert {name: (project / name).read_text(encoding="utf-8") for name in originals} == originals
