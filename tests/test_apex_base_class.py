"""apex.amp set up by a base class of one file for its subclasses in others: `trainers/base.py`'s
`BaseTrainer.__init__` calls `amp.initialize` on `self.model, self.optimizer`; the subclasses of
`trainers/classifier.py` and `trainers/regressor.py` scale their losses with `self.optimizer`
(engine/apex_base_class.py has the facts and the decision, rules/apex/_base_class.py both sides).

The fixture tests/fixtures/AMP101/apex_base_class.project is written from scratch. The base's
`__init__` makes `self.scaler` where `amp.initialize` was (before its `if`, `enabled=` its test),
the subclasses read it; every side migrates or none does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ampmigrate.engine.apex_base_class import decide_base
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_threading import ROOT, _compiles_and_is_stable, _edit, _fix, _index, _refused

PROJECT = FIXTURES / "AMP101" / "apex_base_class.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_index_records_the_setup_class_and_its_subclasses():
    a = summarize((PROJECT / "trainers" / "base.py").read_bytes(), "trainers")
    assert a.apex_setup_classes == {"BaseTrainer": ("model", "optimizer", "")}
    assert a.apex_init_function == ""
    b = summarize((PROJECT / "trainers" / "classifier.py").read_bytes(), "trainers")
    assert b.apex_subclass_steps == {"ClassifierTrainer": ("trainers.base", "BaseTrainer", "optimizer", "")}
    assert b.apex_step_functions == {}
    c = summarize((PROJECT / "trainers" / "regressor.py").read_bytes(), "trainers")
    assert c.apex_subclass_steps == {"RegressorTrainer": ("trainers.base", "BaseTrainer", "optimizer", "")}


def test_the_decision_names_every_subclass(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    decision = decide_base(index, str(project / "trainers" / "base.py"), "BaseTrainer")
    assert decision.migrate and decision.scaler == "scaler" and decision.model == "model"
    assert [(Path(path).name, classes) for path, classes in decision.members] == [
        ("classifier.py", ("ClassifierTrainer",)),
        ("regressor.py", ("RegressorTrainer",)),
    ]


def test_fix_makes_the_scaler_in_the_base_and_reads_it_in_the_subclasses(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    base = (project / "trainers" / "base.py").read_text()
    classifier = (project / "trainers" / "classifier.py").read_text()
    regressor = (project / "trainers" / "regressor.py").read_text()
    assert "apex" not in base + classifier + regressor
    assert (
        "        # mixed precision\n"
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=self.args.fp16)\n'
        "\n"
        "        self.epoch = 0\n"
    ) in base
    assert (
        "            self.optimizer.zero_grad()\n"
        '            with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n'
        "                logits = self.model(inputs)\n"
        "                loss = F.cross_entropy(logits, labels)\n"
        "            if self.args.fp16:\n"
        "                self.scaler.scale(loss).backward()\n"
        "                self.scaler.unscale_(self.optimizer)\n"
    ) in classifier
    assert (
        "            if self.args.fp16:\n"
        "                self.scaler.step(self.optimizer)\n"
        "                self.scaler.update()\n"
        "            else:\n"
        "                self.optimizer.step()\n"
    ) in classifier
    assert (
        '            with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n'
        "                prediction = self.model(inputs)\n"
        "                loss = self.weight * torch.nn.functional.mse_loss(prediction, targets)\n"
        "            self.optimizer.zero_grad()\n"
        "            self.scaler.scale(loss).backward()\n"
        "            self.scaler.step(self.optimizer)\n"
        "            self.scaler.update()\n"
    ) in regressor
    assert (project / "main.py").read_text() == (PROJECT / "main.py").read_text()
    _compiles_and_is_stable(project)


def test_a_subclass_that_does_not_run_the_base_init_first_stops_every_side(tmp_path):
    project = _copy(tmp_path)
    _edit(
        project / "trainers" / "regressor.py",
        "        super(RegressorTrainer, self).__init__(args, model)\n        self.weight = weight\n",
        "        self.weight = weight\n        super(RegressorTrainer, self).__init__(args, model)\n",
    )
    reasons = _refused(project)
    why = "`RegressorTrainer.__init__` does not start by running `Base.__init__`"
    assert why in reasons["base.py"] and why in reasons["classifier.py"] and why in reasons["regressor.py"]


def test_another_file_scaling_with_apex_without_setting_it_up_stops_every_side(tmp_path):
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "from apex import amp\n\nfrom trainers.base import BaseTrainer\n\n\n"
        "def finetune(trainer, batch):\n"
        "    loss = trainer.model(batch).sum()\n"
        "    with amp.scale_loss(loss, trainer.optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    trainer.optimizer.step()\n"
    )
    reasons = _refused(project)
    why = "finetune.py imports trainers/base.py and scales a loss with apex's amp elsewhere than in a subclass"
    assert why in reasons["base.py"] and why in reasons["classifier.py"]


def test_a_subclass_of_a_subclass_in_a_third_file_stops_every_side(tmp_path):
    project = _copy(tmp_path)
    (project / "smoothed.py").write_text(
        "from apex import amp\n\nfrom trainers.classifier import ClassifierTrainer\n\n\n"
        "class SmoothedTrainer(ClassifierTrainer):\n"
        "    def train_epoch(self, loader):\n"
        "        for inputs, labels in loader:\n"
        "            loss = self.model(inputs).logsumexp(-1).mean()\n"
        "            with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
        "                scaled_loss.backward()\n"
        "            self.optimizer.step()\n"
    )
    reasons = _refused(project)
    why = "smoothed.py imports trainers/classifier.py and scales a loss with apex's amp without setting it up"
    assert why in reasons["base.py"] and why in reasons["regressor.py"]


def test_an_attribute_named_scaler_elsewhere_gives_the_gradscaler_another_name(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "main.py", "    trainer = ClassifierTrainer(args, model)\n",
          "    trainer = ClassifierTrainer(args, model)\n    trainer.scaler = None  # a data scaler\n")
    _fix(project)
    base = (project / "trainers" / "base.py").read_text()
    classifier = (project / "trainers" / "classifier.py").read_text()
    assert 'self.grad_scaler = torch.amp.GradScaler("cuda", enabled=self.args.fp16)\n' in base
    assert "self.grad_scaler.scale(loss).backward()\n" in classifier and "self.scaler" not in classifier


def _check_cached(project: Path, cache: Path):
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", "--cache-dir", str(cache), "--exit-zero", "--select", "AMP101",
         "--output-format", "json", "."],
        cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
    )
    return {Path(f["filename"]).name: f.get("no_fix_reason") for f in json.loads(done.stdout)}


def test_each_side_follows_a_change_in_another_subclass_file_through_the_cache(tmp_path):
    project = _copy(tmp_path)
    cache = tmp_path / "cache"
    first = _check_cached(project, cache)
    assert first["base.py"] is None and first["classifier.py"] is None  # fixable
    _edit(project / "trainers" / "regressor.py", "            self.optimizer.step()\n", "            pass\n")
    again = _check_cached(project, cache)
    why = "`self.optimizer.step()` is not called in `RegressorTrainer.train_epoch()`"
    assert why in (again["base.py"] or "") and why in (again["classifier.py"] or "")


def test_apex_set_up_in_another_method_of_the_base_gets_a_disabled_default_in_its_init(tmp_path):
    project = _copy(tmp_path)
    _edit(
        project / "trainers" / "base.py",
        "        # mixed precision\n        if self.args.fp16:\n",
        "        self.epoch = 0\n\n    def enable_fp16(self):\n        if self.args.fp16:\n",
    )
    _edit(project / "main.py", "    trainer = ClassifierTrainer(args, model)\n",
          "    trainer = ClassifierTrainer(args, model)\n    trainer.enable_fp16()\n")
    _fix(project)
    base = (project / "trainers" / "base.py").read_text()
    assert (
        "    def __init__(self, args, model):\n"
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=False)\n'
        "        self.args = args\n"
    ) in base
    assert '    def enable_fp16(self):\n        self.scaler = torch.amp.GradScaler("cuda", enabled=self.args.fp16)\n' in base
    assert "self.scaler.scale(loss).backward()" in (project / "trainers" / "regressor.py").read_text()
    _compiles_and_is_stable(project)


def test_apex_set_up_in_another_method_of_a_base_without_init_stops_every_side(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "trainers" / "base.py", "    def __init__(self, args, model):\n", "    def build(self, args, model):\n")
    reasons = _refused(project)
    why = "`BaseTrainer` sets apex up in `build()` and has no `__init__` of its own"
    assert why in reasons["base.py"] and why in reasons["regressor.py"]


def test_a_class_of_another_file_skipping_a_subclass_init_stops_every_side(tmp_path):
    """It inherits the scaled training step but its instances would never get the scaler."""
    project = _copy(tmp_path)
    (project / "tuned.py").write_text(
        "from trainers.classifier import ClassifierTrainer\n\n\n"
        "class TunedTrainer(ClassifierTrainer):\n    def __init__(self, args, model, optimizer):\n"
        "        self.args, self.model, self.optimizer, self.epoch = args, model, optimizer, 0\n"
    )
    reasons = _refused(project)
    why = "`TunedTrainer` in tuned.py derives from `BaseTrainer` or a subclass of it"
    assert why in reasons["base.py"] and why in reasons["classifier.py"]


# ------------------------------------------------------------------ `import apex`, a registry's decorator
SPELLED = FIXTURES / "AMP101" / "apex_base_class_spelled.project"


def test_the_spelled_out_module_and_a_registry_decorator_are_the_same_shape():
    """`try: import apex` then `apex.amp.initialize(...)` in the base, `@ENGINES.register(...)`
    on the subclasses (engine/apex_spelled.py, `registers_only`)."""
    base = summarize((SPELLED / "engine" / "base.py").read_bytes(), "engine")
    assert base.apex_setup_classes == {"Engine": ("net", "opt", "")}
    segmentation = summarize((SPELLED / "engine" / "segmentation.py").read_bytes(), "engine")
    assert segmentation.apex_subclass_steps == {"SegmentationEngine": (".base", "Engine", "opt", "")}


def test_fix_migrates_the_spelled_out_base_and_its_registered_subclasses(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(SPELLED, project)
    _fix(project)
    base = (project / "engine" / "base.py").read_text()
    detection = (project / "engine" / "detection.py").read_text()
    assert "apex" not in base + detection + (project / "engine" / "segmentation.py").read_text()
    assert (
        "        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)\n"
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(args.half))\n'
    ) in base
    assert (
        '            with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n'
        "                logits = self.net(inputs)\n"
        "                loss = self.weight * F.cross_entropy(logits, labels) + logits.pow(2).mean()\n"
        "            if self.args.half:\n"
        "                self.scaler.scale(loss).backward()\n"
    ) in detection
    assert '@ENGINES.register("detection")\nclass DetectionEngine(Engine):\n' in detection
    _compiles_and_is_stable(project)


def test_a_decorator_that_may_replace_the_class_stops_every_side(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(SPELLED, project)
    _edit(project / "engine" / "detection.py", '@ENGINES.register("detection")\n', '@ENGINES.register("detection")\n@traced\n')
    _edit(project / "engine" / "detection.py", "from .registry import ENGINES\n", "from .registry import ENGINES, traced\n")
    reasons = _refused(project)
    why = "`DetectionEngine` has a metaclass or decorators"
    assert why in reasons["base.py"] and why in reasons["segmentation.py"]


def test_apex_bound_to_something_else_is_not_read_as_the_package():
    """A module-level `apex = ...` other than the not-installed None: `apex.amp` may be anything."""
    import ast

    from ampmigrate.engine.apex_spelled import view

    text = (SPELLED / "engine" / "segmentation.py").read_text()
    assert view(ast.parse(text)) is not None
    assert view(ast.parse(text.replace("    apex = None\n", "    apex = None\napex = load_plugin('apex')\n"))) is None
    assert view(ast.parse(text.replace("    apex = None\n", "    apex = False\n"))) is None
    assert view(ast.parse(text.replace("class SegmentationEngine(Engine):", "class SegmentationEngine(Engine):\n    apex = 1"))) is None
    assert view(ast.parse(text.replace("apex.amp.scale_loss", "apex.scale_loss"))) is None  # no `apex.amp` spelled


def test_registers_only_reads_registry_decorators():
    import ast

    from ampmigrate.engine.apex_base_class import registers_only

    def decorator(code: str) -> ast.expr:
        return ast.parse(f"{code}\nclass C: pass").body[0].decorator_list[0]

    for code in ("@MODELS.register_module()", "@ENGINES.register('x')", "@reg.TRAINERS.register", "@R.register(name='a')"):
        assert registers_only(decorator(code)), code
    for code in ("@dataclass", "@register", "@wraps(f)", "@MODELS.build()", "@make_register()"):
        assert not registers_only(decorator(code)), code


def _with_package_subclass(tmp_path: Path) -> Path:
    """`engine/__init__.py` re-exports the base too, and a script subclasses it from there."""
    project = tmp_path / "p"
    shutil.copytree(SPELLED, project)
    _edit(project / "engine" / "__init__.py", "from .registry import ENGINES\n", "from .registry import ENGINES\nfrom .base import Engine\n")
    (project / "extra.py").write_text(
        "import torch\nimport apex\n\nfrom engine import Engine\n\n\nclass ExtraEngine(Engine):\n    def run(self):\n"
        "        for inputs, labels in self.batches():\n            loss = self.net(inputs).sum()\n"
        "            with apex.amp.scale_loss(loss, self.opt) as scaled:\n                scaled.backward()\n"
        "            self.opt.step()\n"
    )
    return project


def test_a_subclass_importing_the_base_from_a_package_joins_the_group(tmp_path):
    """Before the package's re-export was followed, the base migrated without this subclass,
    whose `apex.amp.scale_loss` then ran on an optimizer `amp.initialize` never saw."""
    project = _with_package_subclass(tmp_path)
    index = _index(project)
    decision = decide_base(index, str(project / "engine" / "base.py"), "Engine")
    assert decision.migrate and [Path(p).name for p, _ in decision.members] == ["detection.py", "segmentation.py", "extra.py"]
    _fix(project)
    extra = (project / "extra.py").read_text()
    assert "apex" not in extra and "            self.scaler.scale(loss).backward()\n" in extra
    _compiles_and_is_stable(project)


def test_a_subclass_through_the_package_that_cannot_migrate_stops_every_side(tmp_path):
    project = _with_package_subclass(tmp_path)
    _edit(project / "extra.py", "            self.opt.step()\n", "            pass\n")
    reasons = _refused(project)
    why = "`self.opt.step()` is not called in `ExtraEngine.run()`"
    assert why in reasons["base.py"] and why in reasons["segmentation.py"] and why in reasons["extra.py"]
