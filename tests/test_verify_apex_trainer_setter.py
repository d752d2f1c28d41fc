"""Issue 12, at run time: a library-style trainer whose mixed precision is switched on by a property
setter that sets apex up (`trainer.mixed_precision = True`; the scaler is made there, a disabled
one in `__init__`), and whose `apply_model_and_loss(..., backward=True)` scales the loss under
`if backward:` while `train_for()` steps (rules/apex/_method_windows.py: the literal passes that
test, so only `if self.mixed_precision:` is tested again at the step). The project
tests/verify_projects/apex_trainer_setter (written for these tests) trains like the original on the
apex emulation."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_trainer_setter"


def test_the_trainer_switched_on_by_its_setter_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_trainer_setter")
    originals = {name: (project / name).read_text(encoding="utf-8") for name in ("train.py", "trainer.py")}
    assert _apex_amp_uses(originals["trainer.py"])
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--mixed-precision")
    assert_trains_like_the_apex_original(result, data)
    assert data["migration"]["changed_files"] == {"trainer.py": 3}
    assert {name: (project / name).read_text(encoding="utf-8") for name in originals} == originals
