"""apex.amp split across two files, the training step in a trainer class: `run.py` calls
`amp.initialize` in `main()` and constructs `Trainer(model, optimizer, ...)` imported from
`training/trainer.py`, whose `train_step()` runs `with amp.scale_loss(loss, self.optimizer)`
(engine/apex_trainer_class.py has the facts, rules/apex/_trainer_class.py the B side's edits).

The fixture tests/fixtures/AMP101/apex_trainer_class.project is written from scratch. The
constructor takes the GradScaler `run.py` creates where `amp.initialize` was, as a keyword-only
`scaler` (no default: a construction that does not pass it fails at once), stored first thing as
`self.scaler`. Every construction in the run passes it, or every side refuses.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import types
import warnings
from pathlib import Path

import pytest

from ampmigrate.engine.apex_threading import decide, initializer_targets
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused

TRAINER = FIXTURES / "AMP101" / "apex_trainer_class.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(TRAINER, project)
    return project


def test_index_records_the_class_like_a_step_function():
    b = summarize((TRAINER / "training" / "trainer.py").read_bytes(), "training")
    assert b.apex_step_functions == {
        "Trainer": (["model", "optimizer", "epochs", "fp16", "grad_clip"], "optimizer", "scaler", "")
    }
    a = summarize((TRAINER / "run.py").read_bytes(), "")
    assert (a.apex_init_function, a.apex_init_problem) == ("main", "")
    assert a.apex_init_calls == [("Trainer", 16, 1, "", 1)]


def test_both_sides_decide_the_same(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    trainer = str(project / "training" / "trainer.py")
    decision = decide(index, trainer, "Trainer")
    assert decision.migrate and decision.callers == ("run.py",) and decision.scaler == "scaler"
    targets, reason = initializer_targets(index, str(project / "run.py"))
    assert reason is None and targets == [(trainer, "Trainer")]


def test_fix_threads_the_scaler_into_the_constructor(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    a = (project / "run.py").read_text()
    b = (project / "training" / "trainer.py").read_text()
    assert "import apex" not in a + b and "from apex" not in a + b
    assert (
        '    scaler = torch.amp.GradScaler(\n        "cuda",\n        enabled=bool(args.fp16) and args.fp16_opt_level != "O0",\n    )\n'
    ) in a
    assert "grad_clip=args.grad_clip, scaler=scaler)\n" in a
    assert (
        "    def __init__(self, model, optimizer, epochs=1, fp16=False, grad_clip=0.0, *, scaler):\n"
        "        self.scaler = scaler\n"
        "        self.model = model\n"
    ) in b
    assert (
        '        with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n'
        "            output = self.model(x)\n"
        "            loss = self.criterion(output, y)\n"
    ) in b
    assert "            self.scaler.scale(loss).backward()\n        else:\n            loss.backward()\n" in b
    assert "                self.scaler.unscale_(self.optimizer)\n" in b
    assert (
        "        if self.fp16:\n            self.scaler.step(self.optimizer)\n            self.scaler.update()\n"
        "        else:\n            self.optimizer.step()\n"
    ) in b
    _compiles_and_is_stable(project)


# ---------------------------------------------------------------------- what cannot be followed
CONSTRUCT = "    trainer = Trainer(model, optimizer, epochs=args.epochs, fp16=args.fp16, grad_clip=args.grad_clip)\n"
INIT = "    if args.fp16:\n        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)\n"


def test_a_construction_before_initialize_makes_both_refuse(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "run.py", INIT + CONSTRUCT, CONSTRUCT + INIT)
    reasons = _refused(project)
    assert "run.py constructs or calls `Trainer` before `amp.initialize`" in reasons["run.py"]
    assert "run.py constructs or calls `Trainer` before `amp.initialize`" in reasons["trainer.py"]


def test_a_subclass_in_the_caller_makes_both_refuse(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "run.py", "\n\ndef main(", "\n\nclass LoggingTrainer(Trainer):\n    pass\n\n\ndef main(")
    reasons = _refused(project)
    for side in ("trainer.py", "run.py"):
        assert "run.py uses `Trainer" in reasons[side] and "otherwise than by calling it" in reasons[side]


def test_a_trainer_with_a_base_class_takes_the_scaler(tmp_path):
    """A plain base class (old-style `super()` included) does not change whose `__init__` a
    construction runs: the class's own, which takes the scaler."""
    project = _copy(tmp_path)
    trainer = project / "training" / "trainer.py"
    _edit(trainer, "class Trainer:", "class Base:\n    def __init__(self):\n        self.steps = 0\n\n\nclass Trainer(Base):")
    _edit(trainer, "        self.model = model\n", "        super(Trainer, self).__init__()\n        self.model = model\n")
    _fix(project)
    b = trainer.read_text()
    assert "import apex" not in b and "from apex" not in b
    assert (
        "    def __init__(self, model, optimizer, epochs=1, fp16=False, grad_clip=0.0, *, scaler):\n"
        "        self.scaler = scaler\n"
        "        super(Trainer, self).__init__()\n"
    ) in b
    assert "grad_clip=args.grad_clip, scaler=scaler)\n" in (project / "run.py").read_text()
    _compiles_and_is_stable(project)


def test_a_decorated_trainer_refuses(tmp_path):
    """A decorator (a registry's `register_module()`) may replace the class or construct it
    elsewhere: both sides refuse."""
    project = _copy(tmp_path)
    _edit(project / "training" / "trainer.py", "class Trainer:", "def register(cls):\n    return cls\n\n\n@register\nclass Trainer:")
    reasons = _refused(project)
    assert "`Trainer` has a metaclass, decorators or computed base classes" in reasons["trainer.py"]
    assert "`Trainer` has a metaclass, decorators" in reasons["run.py"]


def test_a_caller_without_amp_makes_both_refuse(tmp_path):
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "from training.trainer import Trainer\n\n\ndef finetune(model, optimizer, batches):\n"
        "    return Trainer(model, optimizer).train(batches)\n"
    )
    reasons = _refused(project)
    assert "finetune.py calls `Trainer()` and has no `amp.initialize`" in reasons["trainer.py"]
    assert "finetune.py calls `Trainer()` and has no `amp.initialize`" in reasons["run.py"]


def test_apex_imported_in_another_method_refuses(tmp_path):
    """lonePatient's trainer: `from apex import amp` in `__init__`, `amp.scale_loss` in
    `train_epoch()` (a NameError under fp16): nothing to follow."""
    project = _copy(tmp_path)
    trainer = project / "training" / "trainer.py"
    _edit(trainer, "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n", "")
    _edit(trainer, "        self.model = model\n", "        if fp16:\n            from apex import amp\n        self.model = model\n")
    reasons = _refused(project)
    assert "is local to `__init__`, so this raises NameError under fp16" in reasons["trainer.py"]
    assert "nor in `Trainer.train_step()` (an import in another method does not reach it)" in reasons["run.py"]


def test_the_optimizer_set_elsewhere_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(
        project / "training" / "trainer.py",
        "    def train(self, batches):\n",
        "    def reset(self, optimizer):\n        self.optimizer = optimizer\n\n    def train(self, batches):\n",
    )
    reasons = _refused(project)
    assert "`Trainer` does not set `self.optimizer` once, in `__init__`, from a parameter" in reasons["trainer.py"]


# ---------------------------------------------------------------------- at run time
def _apex_stand_in():
    """apex.amp for fp32 runs: the API, none of the casting (as tests/test_apex.py's)."""
    import contextlib

    amp = types.ModuleType("apex.amp")
    amp.initialize = lambda models, optimizers=None, **kwargs: (models, optimizers)
    amp.scale_loss = contextlib.contextmanager(lambda loss, optimizers, **kwargs: (yield loss))
    amp.master_params = lambda optimizer: (p for group in optimizer.param_groups for p in group["params"])
    apex = types.ModuleType("apex")
    apex.amp = amp
    return {"apex": apex, "apex.amp": amp}


def _train(monkeypatch, project: Path, fp16: bool):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    batches = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(4)]
    args = types.SimpleNamespace(
        device="cpu", lr=0.5, fp16=fp16, fp16_opt_level="O1", epochs=3, grad_clip=0.5
    )
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(project))
        for name in [m for m in sys.modules if m == "run" or m.split(".")[0] == "training"]:
            patch.delitem(sys.modules, name)
        for name, module in _apex_stand_in().items():
            patch.setitem(sys.modules, name, module)
        run = importlib.import_module("run")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast("cuda") without CUDA: disabled, as expected here
            losses = run.main(args, batches)
        for name in [m for m in sys.modules if m == "run" or m.split(".")[0] == "training"]:
            patch.delitem(sys.modules, name)
    return losses


@pytest.mark.parametrize("fp16", [True, False])
def test_the_migrated_trainer_trains_like_the_original(monkeypatch, tmp_path, fp16):
    torch = pytest.importorskip("torch")
    original = _train(monkeypatch, TRAINER, fp16)
    project = _copy(tmp_path)
    _fix(project)
    assert "from apex" not in (project / "training" / "trainer.py").read_text()

    made = []

    class CpuGradScaler(torch.amp.GradScaler):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__("cpu", *args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.amp, "GradScaler", CpuGradScaler)
    migrated = _train(monkeypatch, project, fp16)
    assert len(made) == 1 and made[0].is_enabled() is fp16
    if fp16:
        assert made[0].get_scale() == 65536.0  # scaled and stepped every time, nothing skipped
    assert len(migrated) == len(original) == 12
    assert migrated == pytest.approx(original, rel=1e-5)


# ---------------------------------------------------------------------- in one file
IN_FILE = FIXTURES / "AMP101" / "class_trainer_constructed.py"


def _run_in_file(monkeypatch, code: str, use_amp: bool):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    loader = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(3)]
    opts = types.SimpleNamespace(amp=use_amp, max_norm=0.1, epochs=2)
    with monkeypatch.context() as patch:
        patch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
        for name, module in _apex_stand_in().items():
            patch.setitem(sys.modules, name, module)
        namespace = {"__name__": "program"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast("cuda") without CUDA: disabled, as expected here
            exec(compile(code, "program.py", "exec"), namespace)
            return namespace["main"](opts, loader)


@pytest.mark.parametrize("use_amp", [True, False])
def test_the_trainer_built_in_its_own_file_trains_like_the_original(monkeypatch, use_amp):
    torch = pytest.importorskip("torch")
    original = _run_in_file(monkeypatch, IN_FILE.read_text(), use_amp)
    migrated_code = IN_FILE.with_name("class_trainer_constructed.expected.py").read_text()
    made = []

    class CpuGradScaler(torch.amp.GradScaler):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__("cpu", *args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.amp, "GradScaler", CpuGradScaler)
    migrated = _run_in_file(monkeypatch, migrated_code, use_amp)
    assert len(made) == 1 and made[0].is_enabled() is use_amp
    assert len(migrated) == len(original) == 6
    assert migrated == pytest.approx(original, rel=1e-5)


def test_a_decorated_method_that_never_uses_apex_keeps_the_class():
    """A `@torch.no_grad()` evaluation method (or a staticmethod) beside the training step never
    reads the scaler; a decorated method that scales the loss still refuses."""
    text = (TRAINER / "training" / "trainer.py").read_text()
    evaluation = "\n    @torch.no_grad()\n    def evaluate(self, x):\n        return self.model(x).argmax(1)\n\n    @staticmethod\n    def accuracy(p, y):\n        return (p == y).float().mean()\n"
    plain = summarize((text + evaluation).encode(), "training")
    assert plain.apex_step_functions["Trainer"][3] == ""
    decorated = text.replace("    def train_step(self, x, y):", "    @torch.no_grad()\n    def train_step(self, x, y):")
    problem = summarize(decorated.encode(), "training").apex_step_functions["Trainer"][3]
    assert problem == "`Trainer.train_step()` is not a plain method"
