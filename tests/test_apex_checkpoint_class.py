"""apex.amp checkpoint saver classes in another file: a `TrainingRestorer`-like class whose methods
run `amp.state_dict()` / `amp.load_state_dict(x)`, constructed by the training scripts that call
`amp.initialize` (engine/apex_checkpoint.py `_class_record`, rules/apex/_checkpoint_threading.py
`_HelperAccess`).

The fixture tests/fixtures/AMP101/apex_checkpoint_class.project (written from scratch):
`common/saving.py` holds `Resumer` (restores in `__init__`, saves from `step()`) and an unused
`PlainResumer`; `train.py` imports `Resumer` under another name, calls `amp.initialize`, then
constructs it. The constructor takes the scaler (stored first thing as `self.scaler`), and every
construction in the run passes it; otherwise every side refuses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ampmigrate.engine.apex_checkpoint import decide_state, state_helpers_called
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_threading import ROOT, _compiles_and_is_stable, _edit, _fix, _index, _refused

CLASS = FIXTURES / "AMP101" / "apex_checkpoint_class.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(CLASS, project)
    return project


def test_index_records_the_class_and_the_aliased_construction():
    b = summarize((CLASS / "common" / "saving.py").read_bytes(), "common")
    assert b.apex_state_functions == {
        "Resumer": (["opts", "model", "optimizer"], "scaler", ""),
        "PlainResumer": (["opts", "optimizer"], "scaler", ""),
    }
    a = summarize((CLASS / "train.py").read_bytes(), "")
    assert a.apex_initializes == 1
    assert a.apex_name_uses["Resumer"] == (1, 0)  # `Resumer as TrainingResumer`: by the imported name


def test_both_sides_decide_the_same(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    saving = str(project / "common" / "saving.py")
    decision = decide_state(index, saving, "Resumer")
    assert decision.migrate and decision.callers == ("train.py",) and decision.scaler == "scaler"
    # Unused, beside a class the run constructs: it takes the scaler too (no call to break).
    unused = decide_state(index, saving, "PlainResumer")
    assert unused.migrate and unused.callers == ()
    assert not decide_state(index, saving, "PlainResumer", alone=True).migrate
    # keyed by the helper as train.py spells it (`from common.saving import Resumer as TrainingResumer`)
    assert state_helpers_called(index, str(project / "train.py")) == {"TrainingResumer": (saving, "Resumer")}


def test_fix_threads_the_scaler_into_the_class(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    a = (project / "train.py").read_text()
    b = (project / "common" / "saving.py").read_text()
    assert "from apex" not in a and "from apex" not in b
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=bool(opts.fp16))\n' in a
    assert "    resumer = TrainingResumer(opts, model, optimizer, scaler=scaler)\n" in a
    assert a.index("scaler = torch.amp.GradScaler") < a.index("resumer = TrainingResumer")
    assert (
        "    def __init__(self, opts, model, optimizer, scaler):\n"
        "        self.scaler = scaler\n"
        '        self.path = os.path.join(opts.output_dir, "resume.pt")\n'
    ) in b  # first: `__init__` restores through `self.restore()`
    assert '            state["amp"] = self.scaler.state_dict()\n' in b
    assert (
        '            if "scale" in state["amp"]:  # a GradScaler state; apex saved `loss_scaler0` instead\n'
        '                self.scaler.load_state_dict(state["amp"])\n'
    ) in b
    assert "    def __init__(self, opts, optimizer, scaler):\n        self.scaler = scaler\n" in b
    _compiles_and_is_stable(project)


def test_migrated_class_saves_and_resumes_the_scaler(tmp_path):
    """Run the migrated `Resumer` on the CPU: a save after two steps, then a new instance resumes
    the scaler's state in `__init__`; an apex checkpoint (`loss_scaler0`) still resumes."""
    project = _copy(tmp_path)
    _fix(project)
    script = tmp_path / "run.py"
    script.write_text(
        "import types, torch\n"
        "from common.saving import Resumer\n"
        "opts = types.SimpleNamespace(output_dir=%r, save_every=2, fp16=True)\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=8.0)\n"
        "scaler.scale(model(torch.ones(1, 2)).sum()).backward(); scaler.step(opt); scaler.update(2.0)\n"
        "r = Resumer(opts, model, opt, scaler=scaler)\n"
        "r.step(); r.step()\n"
        "fresh = torch.amp.GradScaler('cpu', init_scale=1024.0)\n"
        "Resumer(opts, model, opt, scaler=fresh)\n"
        "assert fresh.get_scale() == 2.0, fresh.get_scale()\n"
        "state = torch.load(r.path, weights_only=False); state['amp'] = {'loss_scaler0': {'loss_scale': 4.0, 'unskipped': 0}}\n"
        "torch.save(state, r.path)\n"
        "other = torch.amp.GradScaler('cpu', init_scale=1024.0)\n"
        "Resumer(opts, model, opt, scaler=other)\n"
        "print('ok', other.get_scale())\n" % str(tmp_path)
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=project, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": f"{project}:{ROOT}"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok 1024.0"


def test_construction_before_initialize_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(
        project / "train.py",
        '    model, optimizer = amp.initialize(model, optimizer, enabled=opts.fp16, opt_level="O1")\n'
        "    resumer = TrainingResumer(opts, model, optimizer)\n",
        "    resumer = TrainingResumer(opts, model, optimizer)\n"
        '    model, optimizer = amp.initialize(model, optimizer, enabled=opts.fp16, opt_level="O1")\n',
    )
    reasons = _refused(project)
    assert "`Resumer()` is called at line 9, before `amp.initialize` (line 10)" in reasons["saving.py"]
    assert "`Resumer()` is called at line 9, before `amp.initialize` (line 10)" in reasons["train.py"]


def test_keyword_only_beside_kwargs(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "common" / "saving.py", "    def __init__(self, opts, model, optimizer):\n", "    def __init__(self, opts, model, optimizer, **extra):\n")
    _fix(project)
    assert "    def __init__(self, opts, model, optimizer, *, scaler, **extra):\n" in (project / "common" / "saving.py").read_text()
    assert "TrainingResumer(opts, model, optimizer, scaler=scaler)" in (project / "train.py").read_text()
    _compiles_and_is_stable(project)


def test_a_subclass_in_its_own_file_refuses(tmp_path):
    project = _copy(tmp_path)
    path = project / "common" / "saving.py"
    path.write_text(path.read_text() + "\n\nclass QuietResumer(Resumer):\n    pass\n")
    reasons = _refused(project)
    assert "`Resumer` is also used in its own file" in reasons["saving.py"]
    assert "`Resumer` is also used in its own file" in reasons["train.py"]


def test_a_construction_without_amp_makes_every_side_refuse(tmp_path):
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(
        "from common.saving import Resumer\n\n\ndef evaluate(opts, model, optimizer):\n"
        "    return Resumer(opts, model, optimizer)\n"
    )
    reasons = _refused(project)
    assert "evaluate.py calls `Resumer()` and has no `amp.initialize`" in reasons["saving.py"]
    assert "evaluate.py calls `Resumer()` and has no `amp.initialize`" in reasons["train.py"]


def test_an_unused_class_alone_refuses(tmp_path):
    """With no class of the file constructed by the run, the run may not hold its program."""
    project = _copy(tmp_path)
    _edit(project / "train.py", "    resumer = TrainingResumer(opts, model, optimizer)\n", "")
    _edit(project / "train.py", "        resumer.step()\n", "")
    _edit(project / "train.py", "from common.saving import Resumer as TrainingResumer\n", "")
    _fix(project)
    assert "from apex import amp" in (project / "common" / "saving.py").read_text()
    assert "from apex" not in (project / "train.py").read_text()


def test_a_decorated_method_using_apex_refuses(tmp_path):
    """`save()` reads apex's state, so it must be a plain method on `self`; a decorated method
    that never uses apex (the `@property` `step`) does not matter."""
    project = _copy(tmp_path)
    _edit(project / "common" / "saving.py", "    def save(self):\n", "    @property\n    def save(self):\n")
    reasons = _refused(project)
    assert "`Resumer.save()` is not a plain method" in reasons["saving.py"]
