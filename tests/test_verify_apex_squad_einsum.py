"""Issue 12, at run time: transformers' `run_squad.py` shape (tests/verify_projects/apex_squad_einsum,
written for this test): `apex.amp.register_half_function(torch, "einsum")` before the model is built,
`amp.initialize` in `train()`. The safe fix removes the registration (AMP105: CUDA autocast casts
einsum's inputs to fp16 by itself; bench/gpu/RESULTS.md has the H200 check) and migrates the rest,
so the script imports no apex at all; `verify` says it trains like the apex original, whose einsums
the emulation runs in fp16 as apex did."""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT
from test_verify_apex_programs import _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_squad_einsum"


def _apex_imports(text: str) -> list:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "apex"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "apex":
            found.append(node.module)
    return found


def test_run_squad_with_registered_einsum_migrates_without_apex_and_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECT, tmp_path / "apex_squad_einsum")
    original = (project / "run_squad.py").read_text(encoding="utf-8")
    fixed = _safe_fix(project)["run_squad.py"]
    compile(fixed, "run_squad.py", "exec")
    assert _apex_imports(original) == ["apex", "apex"] and _apex_imports(fixed) == []
    assert "register_half_function" not in fixed and "torch.einsum" in fixed

    result, data = run_verify(cli, monkeypatch, project, "run_squad.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--fp16")

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and "apex.amp" in run["apex_emulation"]
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    assert (project / "run_squad.py").read_text(encoding="utf-8") == original
