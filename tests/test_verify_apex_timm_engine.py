"""Issue 12, at run time: a timm-derived script whose training loop (`engine.py`), checkpoint saver
(`checkpoint_saver.py`) and model (`net.py`, star-imported) are other files of its repository,
under apex O2 (tests/verify_projects/apex_timm_engine). The safe fix follows the loss scaler and
the autocast variable into those files (rules/apex/_timm_remote.py) and changes train.py alone;
verified against the apex original on the emulation (an fp16 model with fp32 master weights
before, fp16 autocast over fp32 weights after).
"""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT
from test_apex_threading import _fix
from test_verify_apex_programs import _apex_amp_uses
from test_verify_apex_trainers import _max_relative_difference
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_timm_engine"
# the stand-in `timm` package (ApexScaler, NativeScaler) the project runs with, shared with apex_timm_scaler
STAND_IN = ROOT / "tests" / "verify_projects" / "apex_timm_scaler" / "timm"


def test_the_o2_apex_arm_with_its_loop_elsewhere_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_timm_engine")
    shutil.copytree(STAND_IN, project / "timm", ignore=shutil.ignore_patterns("__pycache__"))
    originals = {p.name: p.read_text(encoding="utf-8") for p in project.glob("*.py")}
    assert _apex_amp_uses(originals["train.py"]), "the project is an apex program"
    fixed_copy = tmp_path / "fixed"
    shutil.copytree(project, fixed_copy)
    _fix(fixed_copy)
    fixed = {p.name: p.read_text(encoding="utf-8") for p in fixed_copy.glob("*.py")}
    assert {name for name in fixed if fixed[name] != originals[name]} == {"train.py"}
    assert _apex_amp_uses(fixed["train.py"]) == []
    assert 'amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)' in fixed["train.py"]

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--apex-amp")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"], data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == ["train.py"]
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and "apex.amp" in run["apex_emulation"]
        assert run["precision"] == "fp16 model + apex loss scale"
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == []
        assert run["precision"] == "fp16 + GradScaler"
        assert run["clips_on_scaled_gradients"] == 0
    assert _max_relative_difference(data) < 1e-3, _max_relative_difference(data)
    assert {p.name: p.read_text(encoding="utf-8") for p in project.glob("*.py")} == originals
