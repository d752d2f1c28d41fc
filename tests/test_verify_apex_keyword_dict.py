"""Issue 12, at run time: the fast adversarial training shape, apex's options in a dict built
before `amp.initialize(model, opt, **amp_args)` (rules/apex/_keyword_dict.py) and an FGSM input
gradient taken from a scaled backward with no step of its own before the training step. The
project tests/verify_projects/apex_fgsm_keyword_dict (written for these tests) trains like the
original on the apex emulation, with apex's static loss scale of 1.0 kept."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_fgsm_keyword_dict"


def test_the_keyword_dict_script_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_fgsm_keyword_dict")
    original = (project / "train.py").read_text(encoding="utf-8")
    assert "**amp_args" in original and _apex_amp_uses(original)
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--opt-level", "O1")
    assert_trains_like_the_apex_original(result, data)
    assert data["migration"]["changed_files"] == {"train.py": 4}  # the four apex.amp sites
    assert (project / "train.py").read_text(encoding="utf-8") == original  # verify never writes the user's file
