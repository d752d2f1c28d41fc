"""Issue 12, at run time: apex's amp module handed to a training function of another file
(rules/apex/_passed_training.py). The project tests/verify_projects/apex_module_passed_to_trainer
(written for these tests) sets apex up under `--apex` (`amp = None` otherwise) and passes the module
to `engine/train.py`'s epoch, which tests `amp is not None`, scales its loss and clips; the
migrated pair (the GradScaler in apex's place, the parameter renamed) trains like the original on
the apex emulation, with and without `--apex`."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_module_passed_to_trainer"
FILES = ("train.py", "engine/train.py")


def test_the_module_passed_project_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_module_passed_to_trainer")
    originals = {name: (project / name).read_text(encoding="utf-8") for name in FILES}
    assert all(_apex_amp_uses(text) for text in originals.values())
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "24", "--runs", "2", "--", "--apex")
    assert_trains_like_the_apex_original(result, data)
    assert sorted(data["migration"]["changed_files"]) == ["engine/train.py", "train.py"]
    # verify never writes the user's files
    assert {name: (project / name).read_text(encoding="utf-8") for name in FILES} == originals


def test_without_apex_both_sides_train_in_fp32_alike(cli, monkeypatch, tmp_path):
    """`amp = None`: the original takes the plain backward; the migration passes a disabled
    GradScaler, whose `is_enabled()` takes the same branch."""
    project = copy_of(PROJECT, tmp_path / "apex_module_passed_to_trainer")
    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "20", "--runs", "2")
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent"
    assert {run["precision"] for side in ("before", "after") for run in data["runs"][side]} == {"fp32"}
