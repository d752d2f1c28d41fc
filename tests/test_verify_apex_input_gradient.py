"""Issue 12, at run time: an input gradient's helper in another file (engine/apex_input_gradients.py,
rules/apex/_input_gradient_threading.py). The project tests/verify_projects/apex_pgd_attack_helper
(written for these tests) takes each step's adversarial inputs from `attacks.attack_pgd`, which the
training script hands its optimizer and which scales its own loss with apex; the migrated pair
(the scaler threaded into the attack, which steps nothing) trains like the original on the apex
emulation, with apex's static loss scale of 1.0 kept."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_pgd_attack_helper"


def test_the_attack_helper_project_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_pgd_attack_helper")
    originals = {name: (project / name).read_text(encoding="utf-8") for name in ("train.py", "attacks.py")}
    assert all(_apex_amp_uses(text) for text in originals.values())
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--opt-level", "O1")
    assert_trains_like_the_apex_original(result, data)
    # every apex.amp site of both files migrated, the attack's included
    assert data["migration"]["changed_files"] == {"attacks.py": 2, "train.py": 3}
    # verify never writes the user's files
    assert {name: (project / name).read_text(encoding="utf-8") for name in originals} == originals
