"""Issue 12, at run time: a setup helper called in a script's `if __name__ == "__main__":` block
(UCSNet's `model, optimizer, ... = distribute_model(args)`), apex set up under a test of a global
of the script and of its arguments (rules/apex/_setup_helper.py). The GradScaler is made in the
block right after the call, `enabled=` the helper's tests there; `main()` reads it. The project
tests/verify_projects/apex_main_block_helper (written for these tests) trains like the original on
the apex emulation."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_main_block_helper"


def test_the_helper_called_in_the_main_block_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_main_block_helper")
    original = (project / "train.py").read_text(encoding="utf-8")
    assert _apex_amp_uses(original)
    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--apex", "--opt-level", "O1"
    )
    assert_trains_like_the_apex_original(result, data)
    assert data["migration"]["changed_files"] == {"train.py": 3}
    assert (project / "train.py").read_text(encoding="utf-8") == original
