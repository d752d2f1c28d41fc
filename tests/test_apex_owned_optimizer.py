"""apex.amp set up by a script on an object whose class owns its optimizer: `train.py` builds the
model through a registry and calls `amp.initialize(model, model.optimizer)`; `RegNet` builds
`self.optimizer` in `__init__` and scales its loss with it in `update()` (engine/apex_owned_optimizer.py
has the facts and the decision, rules/apex/_owned_optimizer.py both sides).

The fixture tests/fixtures/AMP101/apex_owned_optimizer.project is written from scratch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ampmigrate.engine.apex_owned_optimizer import decide_owned
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_base_class import _check_cached
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused

PROJECT = FIXTURES / "AMP101" / "apex_owned_optimizer.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_index_records_the_script_and_the_class():
    script = summarize((PROJECT / "train.py").read_bytes(), "")
    assert script.apex_instance_setups == [("model", "optimizer", "")]
    owner = summarize((PROJECT / "models" / "registration.py").read_bytes(), "models")
    assert owner.apex_owned_optimizers == {"RegNet": ("optimizer", "")}
    assert owner.apex_step_functions == {}


def test_the_decision_names_both_sides(tmp_path):
    project = _copy(tmp_path)
    decision = decide_owned(_index(project), "optimizer")
    assert decision.migrate and decision.scaler == "scaler"
    assert [Path(p).name for p in decision.scripts] == ["train.py"]
    assert [(Path(p).name, c) for p, c in decision.classes] == [("registration.py", "RegNet")]


def test_fix_sets_the_scaler_on_the_object_and_defaults_it_in_the_class(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    script = (project / "train.py").read_text()
    owner = (project / "models" / "registration.py").read_text()
    assert "import amp" not in script + owner
    assert '        print("use apex")\n        model.scaler = torch.amp.GradScaler("cuda")\n' in script
    assert (
        "        super().__init__()\n"
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=False)\n'
        "        self.config = config\n"
    ) in owner
    assert (
        '        with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n'
        "            flow = self.forward(pair)\n"
        "            loss = flow.abs().mean()\n"
        '        if self.config["apex"]:\n'
        "            self.scaler.scale(loss).backward()\n"
    ) in owner
    assert '"amp": self.scaler.state_dict() if self.config["apex"] else None' in owner
    _compiles_and_is_stable(project)


def test_another_file_scaling_with_apex_in_another_shape_stops_both(tmp_path):
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "from apex import amp\n\n\n"
        "def finetune(model, optimizer, batch):\n"
        "    loss = model(batch).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    optimizer.step()\n"
    )
    reasons = _refused(project)
    why = "finetune.py scales a loss with apex's amp without setting it up"
    assert why in reasons["train.py"] and why in reasons["registration.py"]


def test_a_class_reading_master_params_elsewhere_stops_both(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "models" / "registration.py", "    def save(self, path):\n",
          "    def clip(self):\n        torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)\n\n    def save(self, path):\n")
    reasons = _refused(project)
    assert all("registration.py" in reason for reason in reasons.values()), reasons


def test_each_side_follows_a_change_in_the_other_through_the_cache(tmp_path):
    project = _copy(tmp_path)
    cache = tmp_path / "cache"
    first = _check_cached(project, cache)
    assert first["train.py"] is None and first["registration.py"] is None
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O1", cast_inputs=True)')
    again = _check_cached(project, cache)
    assert again["train.py"] is not None and "`amp.initialize` is given `cast_inputs`" in (again["registration.py"] or "")


def test_a_subclass_skipping_the_owners_init_stops_both(tmp_path):
    """Its instances would never get the disabled scaler the owner's `__init__` makes, and its
    fp32 path would then fail where the original ran."""
    project = _copy(tmp_path)
    (project / "models" / "lite.py").write_text(
        "import torch\nfrom torch import nn\n\nfrom models.registration import RegNet\n\n\n"
        "class LiteRegNet(RegNet):\n    def __init__(self, config):\n        nn.Module.__init__(self)\n"
        "        self.config = config\n        self.net = nn.Conv2d(2, 2, 1)\n"
        '        self.optimizer = torch.optim.SGD(self.parameters(), lr=config["lr"])\n'
    )
    reasons = _refused(project)
    why = "`LiteRegNet` in models/lite.py derives from a class owning its optimizer"
    assert why in reasons["train.py"] and why in reasons["registration.py"]
