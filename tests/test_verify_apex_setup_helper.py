"""Issue 12, at run time: apex set up in a helper of another module (`setup_for_training(model,
optimizer, device, n_gpu, fp16, fp16_opt_level)` in model_utils.py calls `amp.initialize` under
`if fp16:` and returns the model and optimizer), the loss scaled by the script calling it
(tests/verify_projects/apex_setup_helper, written for these tests), its opt level a run-time
argument (`--fp16_opt_level`, default O1): the helper's `amp.initialize` becomes an O3 guard and
the caller's GradScaler and autocast are disabled under O0. The safe `fix` drops the
helper's `amp.initialize` and creates the GradScaler after the call (engine/apex_setup_helper.py,
rules/apex/_setup_helper.py); verified against the apex original on the emulation.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_setup_helper"


def test_the_setup_helper_migrated_with_its_caller_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_setup_helper")
    files = ["train.py", "model_utils.py"]
    originals = {name: (project / name).read_text(encoding="utf-8") for name in files}
    assert all(_apex_amp_uses(text) for text in originals.values()), "both files use apex.amp"
    assert "args.fp16_opt_level)" in originals["train.py"]  # the opt level is known only at run time

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert sorted(data["migration"]["changed_files"]) == ["model_utils.py", "train.py"]  # both sides, together
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    assert {name: (project / name).read_text(encoding="utf-8") for name in files} == originals


def test_the_run_time_o0_level_trains_fp32_like_the_original(cli, monkeypatch, tmp_path):
    """`--fp16_opt_level O0`: apex trained in fp32; the migrated GradScaler and autocast are disabled
    (`enabled=args.fp16 and args.fp16_opt_level != "O0"`)."""
    project = copy_of(PROJECT, tmp_path / "apex_setup_helper")
    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--fp16_opt_level", "O0"
    )
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == []
