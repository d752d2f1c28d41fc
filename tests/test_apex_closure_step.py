"""A training step written as a closure of a factory in another file, and apex's amp saved by an
ignite checkpoint handler (rules/apex/_cross_threading.threaded_function, _checkpoint_entries.py).

The fixture tests/fixtures/AMP101/amp_split_closure_step.project (written from scratch) is the
ignite shape: `create_trainer(model, optimizer, ...)` defines `update_fn(engine, batch)`, which
scales the loss with the factory's optimizer and is handed to `Engine`; the script sets apex up,
calls the factory, and checkpoints `to_save={..., "amp": amp}`. The factory takes the scaler (the
closure reads it as it reads `optimizer`), and the checkpoint entry becomes the scaler.
"""

from __future__ import annotations

import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES, check, fix

ROOT = Path(__file__).resolve().parents[1]
PROJECT = FIXTURES / "AMP101" / "amp_split_closure_step.project"


def _fix(project: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--exit-zero", "."],
        cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, check=False,
    )


def _texts(project: Path):
    return {p.relative_to(project).as_posix(): p.read_text() for p in sorted(project.rglob("*.py"))}


def test_the_factory_takes_the_scaler_its_closure_reads(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    _fix(project)
    engine = (project / "engines" / "segmentation.py").read_text()
    script = (project / "scripts" / "train.py").read_text()
    for gone in ("from apex import amp", "amp.initialize", "amp.scale_loss", "amp.load_state_dict"):
        assert gone not in engine and gone not in script
    assert "    use_f16=False,\n    *,\n    scaler,\n):\n    def update_fn(engine, batch):" in engine
    assert "enabled=scaler.is_enabled()):\n            y_pred = model(x)\n            loss = loss_fn(y_pred, y)" in engine
    assert "scaler.scale(loss).backward()" in engine
    assert "create_trainer(model, optimizer, loss_fn, use_f16=True, scaler=scaler)" in script
    assert 'to_save={"model": model, "optimizer": optimizer, "amp": scaler}' in script
    assert 'scaler.load_state_dict(checkpoint["amp"])' in script
    for path in project.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
    before = _texts(project)
    _fix(project)
    assert _texts(project) == before


def test_the_index_summarizes_the_factory_as_the_step_function():
    facts = summarize((PROJECT / "engines" / "segmentation.py").read_bytes(), "engines")
    positional, optimizer, scaler, problem = facts.apex_step_functions["create_trainer"]
    assert (optimizer, scaler, problem) == ("optimizer", "scaler", "")


def test_a_closure_with_its_own_optimizer_parameter_is_not_the_factory_s():
    text = (PROJECT / "engines" / "segmentation.py").read_text().replace(
        "def update_fn(engine, batch):", "def update_fn(engine, batch, optimizer=optimizer):"
    )
    facts = summarize(text.encode(), "engines")
    assert facts.apex_step_functions["create_trainer"][3] == "a function inside `create_trainer()` takes its own `optimizer`"


SAVER = '''import torch
from apex import amp
from ignite.handlers import Checkpoint, DiskSaver

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
handler = Checkpoint({"model": model, "optimizer": optimizer, "amp": amp}, DiskSaver("ckpt"))
for x, y in loader:
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
'''


def test_checkpoint_s_first_argument_saves_the_scaler():
    migrated = fix(SAVER, select=["AMP1"])
    assert 'Checkpoint({"model": model, "optimizer": optimizer, "amp": scaler}, DiskSaver("ckpt"))' in migrated
    assert "apex" not in migrated


def test_a_dict_to_load_or_outside_ignite_stays_a_value_use():
    loading = SAVER.replace('handler = Checkpoint({', 'Checkpoint.load_objects(to_load={').replace(', DiskSaver("ckpt"))', ', checkpoint=ckpt)')
    no_ignite = SAVER.replace("from ignite.handlers import Checkpoint, DiskSaver", "from mylib import Checkpoint, DiskSaver")
    for text in (loading, no_ignite):
        reasons = {f.no_fix_reason for f in check(text, select=["AMP1"]) if f.code == "AMP101"}
        assert reasons and all("apex.amp is used as a value at line 6" in (r or "") for r in reasons), reasons
        assert fix(text, select=["AMP1"]) == text


def test_a_dict_bound_to_a_name_only_saved_is_an_entry_too():
    named = SAVER.replace(
        'handler = Checkpoint({"model": model, "optimizer": optimizer, "amp": amp}, DiskSaver("ckpt"))',
        'to_save = {"model": model, "optimizer": optimizer, "amp": amp}\nhandler = Checkpoint(to_save, DiskSaver("ckpt"))',
    )
    assert 'to_save = {"model": model, "optimizer": optimizer, "amp": scaler}' in fix(named, select=["AMP1"])
    resumed = named + "Checkpoint.load_objects(to_load=to_save, checkpoint=ckpt)\n"  # apex's saved state would reach the scaler
    assert fix(resumed, select=["AMP1"]) == resumed


def test_a_backward_closure_called_before_the_setup_refuses():
    """tests/fixtures/AMP101/closure_backward_helper_local.py migrates a backward closure of the
    setup function; called before `amp.initialize`, it would read the scaler before it is made."""
    early = """import torch
from apex import amp


def train(model, loader, optimizer):
    def backward_loss(loss):
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()

    backward_loss(model(next(iter(loader))))
    optimizer.step()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for batch in loader:
        backward_loss(model(batch))
        optimizer.step()
"""
    reasons = {f.no_fix_reason for f in check(early, select=["AMP1"]) if f.code == "AMP101"}
    expected = "`backward_loss()` scales a loss with apex's amp and is called at line 10, before `amp.initialize` (line 12)"
    assert reasons and all(expected in (r or "") for r in reasons), reasons
    assert fix(early, select=["AMP1"]) == early
