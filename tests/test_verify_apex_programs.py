"""Issue 12, at run time: real apex programs, reduced to CPU-sized models, migrated by the safe
`fix` and verified against their apex originals (the before runs unmodified on the apex emulation).

Each project under tests/verify_projects/apex_* is written for these tests after the training
loop of a public apex program named in its header (the apex calls, the gating, the clipping and
the checkpoints as upstream has them; a tiny model on synthetic data). For each: the safe fix
migrates every apex.amp site of the project (no AMP1 finding about apex.amp is left, the
migrated files import no apex.amp), and `ampmigrate verify --no-unsafe-fixes` says the migrated
program trains like the apex original (exit 0, "equivalent"), with the after running without
apex.amp and the before on the emulation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT, make_settings
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECTS = ROOT / "tests" / "verify_projects"

# project, script, script arguments (the mixed-precision switch where upstream has one), the apex
# modules the migrated program may still import (apex.optimizers is not part of the removed apex.amp)
CASES = {
    "mellotron": ("apex_mellotron", "train.py", [], set()),
    "mongolian_asr": ("apex_ctc_asr", "train.py", ["--mixed-precision"], set()),
    "coqui_tacotron": ("apex_tacotron_tts", "train_tacotron.py", [], set()),
    "waveglow": ("apex_waveglow", "train.py", [], set()),
    "person_reid": ("apex_reid", "train.py", ["--fp16"], {"apex", "apex.optimizers"}),
}

_AMP_APIS = {"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict", "_amp_state"}


def _apex_amp_uses(text: str) -> list:
    """`from apex import amp` / `import apex.amp` imports and `amp.<api>` attribute reads."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("apex"):
            if node.module.startswith("apex.amp") or any(alias.name == "amp" for alias in node.names):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(alias.name.startswith("apex.amp") for alias in node.names):
            found.append(f"line {node.lineno}: import apex.amp")
        elif isinstance(node, ast.Attribute) and node.attr in _AMP_APIS and isinstance(node.value, ast.Name) and node.value.id == "amp":
            found.append(f"line {node.lineno}: amp.{node.attr}")
    return found


def _safe_fix(project: Path) -> dict:
    """Every Python file of the project through the safe fix, as `ampmigrate fix` does: {name: new text}."""
    from ampmigrate.engine.pipeline import Engine

    engine = Engine(make_settings({}))
    fixed = {}
    for path in sorted(project.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        new = engine.fix_text(text, str(path)).new_text
        fixed[path.name] = text if new is None else new
    return fixed


def assert_trains_like_the_apex_original(result, data) -> None:
    """A verify run of an apex program against its safe migration: equivalent, the before on the
    apex emulation, the after on fp16 autocast and a GradScaler, the same number of steps."""
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    steps = {side: [run["steps"] for run in data["runs"][side]] for side in ("before", "after")}
    assert steps["before"] == steps["after"], steps
    for run in data["runs"]["after"]:
        assert not run["apex_emulation"] and run["precision"] == "fp16 + GradScaler"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_real_apex_program_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path, case):
    folder, script, script_args, apex_left = CASES[case]
    project = copy_of(PROJECTS / folder, tmp_path / folder)
    originals = {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")}
    assert _apex_amp_uses(originals[script]), "the project is an apex program"

    # The safe fix migrates every apex.amp site; the migrated program compiles and imports no apex.amp.
    fixed = _safe_fix(project)
    for name, text in fixed.items():
        compile(text, name, "exec")
        assert _apex_amp_uses(text) == [], (name, _apex_amp_uses(text))
    assert fixed[script] != originals[script]

    result, data = run_verify(
        cli, monkeypatch, project, script, "--no-unsafe-fixes", "--steps", "30", "--runs", "2", *(["--", *script_args] if script_args else [])
    )

    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == [script]
    # nothing about apex.amp is left (AMP107: apex.optimizers.FusedSGD, which apex still has)
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1") and code != "AMP107"] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and "apex.amp" in run["apex_emulation"]
        assert run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and set(run["apex_emulation"]) <= apex_left
        assert run["precision"] == "fp16 + GradScaler"
    assert "EQUIVALENT" in result.output
    assert {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")} == originals


def test_the_same_migration_without_its_unscale_is_rejected(cli, monkeypatch, tmp_path):
    """A control: mellotron's migration with `scaler.unscale_` dropped clips gradients still
    multiplied by the loss scale (apex's clip of `amp.master_params` saw them unscaled)."""
    project = copy_of(PROJECTS / "apex_mellotron", tmp_path / "apex_mellotron")
    migrated = _safe_fix(project)["train.py"]
    assert migrated.count("scaler.unscale_(optimizer)\n") == 1
    (project / "no_unscale.py").write_text(migrated.replace("                scaler.unscale_(optimizer)\n", ""), encoding="utf-8")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "no_unscale.py", "--steps", "20", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert data["runs"]["after"][0]["clips_on_scaled_gradients"] > 0
    assert any("clips gradients that a GradScaler scaled" in reason for reason in data["reasons"]), data["reasons"]


def test_espnet_lm_migrates_only_as_an_unsafe_fix_because_o2_clipped_nothing(cli, monkeypatch, tmp_path):
    """ESPnet1's LM updater (tests/verify_projects/apex_espnet_lm) clips `model.parameters()` after
    the scaled backward, with the opt level chosen at run time. Under O1 that clip saw apex's
    unscaled gradients, as the migration's does after `unscale_`; under O2 apex had moved them to
    fp32 master copies and cleared the model's, so the clip clipped nothing. The safe fix leaves
    the program with that reason; the unsafe fix trains like the original at O1 and, as the
    reason says, not at O2."""
    project = copy_of(PROJECTS / "apex_espnet_lm", tmp_path / "apex_espnet_lm")
    original = (project / "train.py").read_text(encoding="utf-8")
    assert _safe_fix(project)["train.py"] == original
    from ampmigrate.engine.pipeline import Engine

    findings = Engine(make_settings({})).check_text(original, str(project / "train.py")).findings
    assert any("under O2 apex kept the gradients in fp32 master copies" in (f.fix.message if f.fix else "") for f in findings)

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "30", "--runs", "2", "--", "--train-dtype", "O1")
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and data["apex_emulation"] is True

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "60", "--runs", "2", "--", "--train-dtype", "O2")
    assert result.exit_code == 1, result.output
    assert data["verdict"] != "equivalent"
    assert (project / "train.py").read_text(encoding="utf-8") == original
