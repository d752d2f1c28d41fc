"""Issue 12, at run time: objectives set up for apex in a loop before training, with the options of
apex's ImageNet command line (rules/apex/_init_enclosure.py's setup loops, rules/apex/_amp_options.py's
run-time options). The project tests/verify_projects/apex_setup_loop (written for these tests) trains
two objectives, each with its model and optimizer; the safe fix makes one GradScaler before the loop,
whose `init_scale` and growth follow `--loss-scale`. With a static loss scale and with apex's dynamic
one, the migrated program trains like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_setup_loop"


@pytest.mark.parametrize("loss_scale", [["--loss-scale", "128"], []], ids=["static", "dynamic"])
def test_setup_loop_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path, loss_scale):
    project = copy_of(PROJECT, tmp_path / "apex_setup_loop")
    original = (project / "train.py").read_text(encoding="utf-8")
    migrated = _safe_fix(project)["train.py"]
    compile(migrated, "train.py", "exec")
    assert _apex_amp_uses(original) and _apex_amp_uses(migrated) == []
    assert '        init_scale=65536.0 if args.loss_scale in (None, "dynamic") else float(args.loss_scale),\n' in migrated
    assert migrated.index("scaler = torch.amp.GradScaler(") < migrated.index("for idx in range(len(loss_models)):")

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "40", "--runs", "2", "--", "--fp16", *loss_scale
    )

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    steps = {side: [run["steps"] for run in data["runs"][side]] for side in ("before", "after")}
    assert steps["before"] == steps["after"], steps
    for run in data["runs"]["after"]:
        assert not run["apex_emulation"] and run["precision"] == "fp16 + GradScaler"
    assert (project / "train.py").read_text(encoding="utf-8") == original
