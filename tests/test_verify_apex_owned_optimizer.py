"""Issue 12, at run time: a script sets apex up on a model that owns its optimizer
(`amp.initialize(model, model.optimizer)`, the model built through a registry), the loss scaled in
the model's own `update()` (tests/verify_projects/apex_owned_optimizer, written for these tests),
migrated by the safe `fix` on both files at once (engine/apex_owned_optimizer.py,
rules/apex/_owned_optimizer.py) and verified against the apex original on the emulation.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_owned_optimizer"


def test_the_owning_class_migrated_with_its_script_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_owned_optimizer")
    files = ["train.py", "models/regressor.py"]
    originals = {name: (project / name).read_text(encoding="utf-8") for name in files}
    assert _apex_amp_uses(originals["train.py"]) and _apex_amp_uses(originals["models/regressor.py"])

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert sorted(data["migration"]["changed_files"]) == ["models/regressor.py", "train.py"]  # both sides, together
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    assert {name: (project / name).read_text(encoding="utf-8") for name in files} == originals
