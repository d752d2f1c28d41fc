"""apex.amp checkpoint helpers in another file: `amp.state_dict()` / `amp.load_state_dict(x)` in
`utils.py`'s `save_checkpoint` / `load_checkpoint`, called from `main.py` which calls
`amp.initialize` (engine/apex_checkpoint.py decides, rules/apex/_checkpoint_threading.py rewrites).

The fixture tests/fixtures/AMP101/apex_checkpoint_helpers.project is the Swin-Transformer shape
(main.py + utils.py), written from scratch. The helper and its callers migrate together or not at
all: a third caller without apex, a module import of the helper's file, a caller whose own plan
stops, or a helper also used in its own file make every side refuse.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ampmigrate.engine.apex_checkpoint import decide_state, state_helpers_called
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused, _snapshot

HELPERS = FIXTURES / "AMP101" / "apex_checkpoint_helpers.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(HELPERS, project)
    return project


def test_index_records_helpers_and_callers():
    b = summarize((HELPERS / "utils.py").read_bytes(), "")
    assert b.apex_state_functions == {
        "load_checkpoint": (["cfg", "model", "optimizer", "logger"], "scaler", ""),
        "save_checkpoint": (["cfg", "epoch", "model", "optimizer", "logger"], "scaler", ""),
    }
    a = summarize((HELPERS / "main.py").read_bytes(), "")
    assert a.apex_initializes == 1
    assert a.apex_name_uses == {"count_parameters": (1, 0), "load_checkpoint": (1, 0), "save_checkpoint": (1, 0)}
    assert a.apex_state_functions == {}


def test_both_sides_decide_the_same(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    for name in ("load_checkpoint", "save_checkpoint"):
        decision = decide_state(index, str(project / "utils.py"), name)
        assert decision.migrate and decision.callers == ("main.py",) and decision.scaler == "scaler"
    assert set(state_helpers_called(index, str(project / "main.py"))) == {"load_checkpoint", "save_checkpoint"}


def test_fix_passes_the_scaler_to_the_helpers(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    a = (project / "main.py").read_text()
    b = (project / "utils.py").read_text()
    assert "from apex" not in a and "from apex" not in b
    assert "start = load_checkpoint(cfg, model, optimizer, logger, scaler=scaler)" in a
    assert "save_checkpoint(cfg, epoch, model, optimizer, logger, scaler=scaler)" in a
    assert "def load_checkpoint(cfg, model, optimizer, logger, scaler):" in b
    assert "def save_checkpoint(cfg, epoch, model, optimizer, logger, scaler):" in b
    assert 'state["amp"] = scaler.state_dict()' in b
    assert 'if "scale" in checkpoint["amp"]:  # a GradScaler state; apex saved `loss_scaler0` instead\n' in b
    assert '            scaler.load_state_dict(checkpoint["amp"])\n' in b
    _compiles_and_is_stable(project)


def test_helper_called_from_a_threaded_function(tmp_path):
    """The helper is called in the training function, where the in-file plan threads the scaler."""
    project = _copy(tmp_path)
    _edit(project / "main.py", "        optimizer.step()\n", "        optimizer.step()\n    save_checkpoint(None, 0, model, optimizer, None)\n")
    _fix(project)
    a = (project / "main.py").read_text()
    assert "def train_one_epoch(model, criterion, loader, optimizer, scaler):" in a
    assert "    save_checkpoint(None, 0, model, optimizer, None, scaler=scaler)\n" in a
    assert "scaler.state_dict()" in (project / "utils.py").read_text()
    _compiles_and_is_stable(project)


def test_a_third_caller_without_amp_makes_every_side_refuse(tmp_path):
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(
        "from utils import load_checkpoint\n\n\ndef evaluate(cfg, model, optimizer, logger):\n"
        "    load_checkpoint(cfg, model, optimizer, logger)\n"
    )
    reasons = _refused(project)
    assert "evaluate.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["utils.py"]
    assert "evaluate.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["main.py"]


def test_a_module_import_calling_a_helper_without_amp_makes_every_side_refuse(tmp_path):
    """`import utils` then `utils.load_checkpoint(...)` is a call of the helper (engine/caller_uses.py),
    in a plain script too (the index records every file's plain imports)."""
    project = _copy(tmp_path)
    (project / "tools.py").write_text(
        "import utils\n\n\ndef resume(cfg, model, optimizer):\n"
        "    return utils.load_checkpoint(cfg, model, optimizer, None)\n"
    )
    reasons = _refused(project)
    assert "tools.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["utils.py"]
    assert "tools.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["main.py"]


def test_a_caller_whose_plan_stops_makes_the_helper_refuse(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "main.py", "opt_level=cfg.opt_level", 'opt_level="O3"')
    reasons = _refused(project)
    assert "main.py cannot be migrated with it" in reasons["utils.py"]


def test_a_helper_used_in_its_own_file_refuses(tmp_path):
    project = _copy(tmp_path)
    (project / "utils.py").write_text((project / "utils.py").read_text() + "\n\ndef auto_resume(cfg, model, optimizer):\n    return load_checkpoint(cfg, model, optimizer, None)\n")
    reasons = _refused(project)
    assert "`load_checkpoint()` is also used in its own file" in reasons["utils.py"]
    assert "`load_checkpoint()` is also used in its own file" in reasons["main.py"]


def test_helper_passed_as_a_value_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "main.py", "    start = 0\n", "    start = 0\n    hooks = [save_checkpoint]\n")
    reasons = _refused(project)
    assert "main.py uses `save_checkpoint()` otherwise than by calling it" in reasons["utils.py"]




def test_an_unsafe_caller_makes_the_helper_unsafe(tmp_path):
    """`loss_scale=` makes the caller's fix unsafe: a safe fix changes neither file, an unsafe one both."""
    project = _copy(tmp_path)
    _edit(project / "main.py", "opt_level=cfg.opt_level)", "opt_level=cfg.opt_level, min_loss_scale=cfg.min_loss_scale)")
    before = _snapshot(project)
    _fix(project)
    assert _snapshot(project) == before
    _fix(project, "--unsafe-fixes")
    assert "scaler=scaler" in (project / "main.py").read_text()
    assert "scaler.state_dict()" in (project / "utils.py").read_text()


def test_split_initializer_passes_its_scaler_to_a_helper(tmp_path):
    """The A side of a split setup (engine/apex_threading.py) also calls a checkpoint helper."""
    project = tmp_path / "p"
    shutil.copytree(FIXTURES / "AMP101" / "amp_split_init_and_step.project", project)
    (project / "checkpoint.py").write_text(
        "import torch\nfrom apex import amp\n\n\ndef save(model, path):\n"
        "    torch.save({\"model\": model.state_dict(), \"amp\": amp.state_dict()}, path)\n"
    )
    _edit(project / "train_net.py", "from trainer import do_train\n", "from checkpoint import save\nfrom trainer import do_train\n")
    _edit(project / "train_net.py", "    return model\n", "    save(model, cfg.output)\n    return model\n")
    _fix(project)
    a = (project / "train_net.py").read_text()
    assert "do_train(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in a
    assert "save(model, cfg.output, scaler=scaler)" in a
    c = (project / "checkpoint.py").read_text()
    assert "def save(model, path, scaler):" in c and '"amp": scaler.state_dict()' in c and "apex" not in c
    _compiles_and_is_stable(project)


# ------------------------------------------------------------------ a package re-exporting the helpers
def _packaged(tmp_path: Path) -> Path:
    """The helpers in `utils/checkpoint.py`, re-exported by `utils/__init__.py` (Swin-Transformer's
    forks with a `utils/` package): main.py's `from utils import ...` is unchanged."""
    project = _copy(tmp_path)
    (project / "utils").mkdir()
    (project / "utils.py").rename(project / "utils" / "checkpoint.py")
    (project / "utils" / "__init__.py").write_text(
        "from .checkpoint import count_parameters, load_checkpoint, save_checkpoint\n\n"
        '__all__ = ["count_parameters", "load_checkpoint", "save_checkpoint"]\n'
    )
    return project


def test_the_callers_of_a_package_reexporting_the_helpers_are_its_callers(tmp_path):
    project = _packaged(tmp_path)
    index = _index(project)
    helper = str(project / "utils" / "checkpoint.py")
    for name in ("load_checkpoint", "save_checkpoint"):
        decision = decide_state(index, helper, name)
        assert decision.migrate and decision.callers == ("main.py",)
    called = state_helpers_called(index, str(project / "main.py"))
    assert {spelled: name for spelled, (_, name) in called.items()} == {
        "load_checkpoint": "load_checkpoint", "save_checkpoint": "save_checkpoint"
    }
    _fix(project)
    a = (project / "main.py").read_text()
    b = (project / "utils" / "checkpoint.py").read_text()
    assert "from apex" not in a and "from apex" not in b
    assert "start = load_checkpoint(cfg, model, optimizer, logger, scaler=scaler)" in a
    assert "def load_checkpoint(cfg, model, optimizer, logger, scaler):" in b
    assert (project / "utils" / "__init__.py").read_text().startswith("from .checkpoint import count_parameters")
    _compiles_and_is_stable(project)


def test_a_caller_of_the_package_without_amp_stops_the_caller_with_amp_too(tmp_path):
    """Before the relay was followed, main.py migrated alone and the helper kept
    `amp.state_dict()` on the `amp = None` of its failed import."""
    project = _packaged(tmp_path)
    (project / "evaluate.py").write_text(
        "from utils import load_checkpoint\n\n\ndef evaluate(cfg, model, optimizer, logger):\n"
        "    load_checkpoint(cfg, model, optimizer, logger)\n"
    )
    reasons = _refused(project)
    assert "evaluate.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["checkpoint.py"]
    assert "evaluate.py calls `load_checkpoint()` and has no `amp.initialize`" in reasons["main.py"]


def test_a_relay_of_the_relay_stops_every_side(tmp_path):
    project = _packaged(tmp_path)
    (project / "tools").mkdir()
    (project / "tools" / "__init__.py").write_text("from utils import load_checkpoint\n")
    (project / "resume.py").write_text(
        "from tools import load_checkpoint\n\n\ndef resume(cfg, model, optimizer, logger):\n"
        "    load_checkpoint(cfg, model, optimizer, logger)\n"
    )
    reasons = _refused(project)
    why = "tools/__init__.py re-exports `load_checkpoint()`"
    assert why in reasons["checkpoint.py"] and why in reasons["main.py"]


def test_a_package_that_calls_the_helper_itself_is_a_caller_not_a_relay(tmp_path):
    project = _packaged(tmp_path)
    _edit(project / "utils" / "__init__.py", "\n__all__", "\nRESUMED = load_checkpoint(None, None, None, None)\n__all__")
    reasons = _refused(project)
    why = "utils/__init__.py re-exports `load_checkpoint()`"
    assert why in reasons["checkpoint.py"] and why in reasons["main.py"]


INFERENCE = FIXTURES / "AMP101" / "apex_checkpoint_inference_caller.project"
INFERENCE_SAVER = FIXTURES / "AMP101" / "apex_checkpoint_inference_saver.project"


def test_index_records_inference_callers_and_loading_helpers():
    assert summarize((INFERENCE / "evaluate.py").read_bytes(), "").apex_inference_only
    assert not summarize((INFERENCE / "train.py").read_bytes(), "").apex_inference_only
    assert summarize((INFERENCE / "checkpoints.py").read_bytes(), "").apex_state_loaders_only == ["load_checkpoint"]
    # an optimizer given by keyword is training, even without `scale_loss` in the file
    source = b"from apex import amp\n\n\ndef setup(m, o):\n    return amp.initialize(m, optimizers=o)\n"
    assert not summarize(source, "").apex_inference_only
    source = b"from apex import amp\n\n\ndef setup(m):\n    return amp.initialize(m, None, opt_level='O1')\n"
    assert summarize(source, "").apex_inference_only  # `None` for the optimizers: inference


def test_an_inference_caller_passes_no_scaler_to_a_loading_helper(tmp_path):
    """An evaluation script (`amp.initialize(model)`, no loss scaled) calls the training's loader:
    it passes nothing, the helper's scaler defaults to None, and its load is skipped there (in
    apex it set the scale of loss scalers an inference program never uses)."""
    project = tmp_path / "p"
    shutil.copytree(INFERENCE, project)
    index = _index(project)
    decision = decide_state(index, str(project / "checkpoints.py"), "load_checkpoint")
    assert decision.migrate and decision.callers == ("train.py",) and decision.optional
    assert [Path(p).name for p in decision.unpassed_paths] == ["evaluate.py"]
    assert not decide_state(index, str(project / "checkpoints.py"), "save_checkpoint").optional
    _fix(project)
    helper, evaluate = (project / "checkpoints.py").read_text(), (project / "evaluate.py").read_text()
    assert "def load_checkpoint(path, model, optimizer=None, resume_training=True, *, scaler=None):" in helper
    assert 'if scaler is not None and "scale" in state["amp"]:' in helper
    assert "def save_checkpoint(path, epoch, model, optimizer, scaler):" in helper
    assert "    load_checkpoint(cfg.checkpoint, model, resume_training=False)\n" in evaluate
    assert "from apex" not in evaluate and "from apex" not in helper
    assert "load_checkpoint(cfg.resume, model, optimizer, scaler=scaler)" in (project / "train.py").read_text()
    _compiles_and_is_stable(project)


def test_an_inference_caller_of_a_saving_helper_keeps_every_side(tmp_path):
    """A saver called where apex was set up for inference would have no scaler to save: the helper
    stays, and so does every caller (the inference caller too: the helper needs its setup)."""
    project = tmp_path / "p"
    shutil.copytree(INFERENCE_SAVER, project)
    reasons = _refused(project)
    why = "export.py sets apex up for inference only and calls `save_checkpoint()`, which saves apex's amp state"
    assert why in reasons["checkpoints.py"] and why in reasons["train.py"]
    assert "`save_checkpoint()` (checkpoints.py) saves or loads apex's amp state and cannot be migrated" in reasons["export.py"]
