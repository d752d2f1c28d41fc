"""apex's amp module reached through a value (engine/apex_values.py, rules/apex/amp_from_helper.py).

The reported shape is the multi-file fixture tests/fixtures/AMP101/amp_from_getter.project (run
by test_project_index.py); here: which functions count as returning apex's amp, and that `fix`
leaves the sites alone.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from ampmigrate.engine.apex_values import apex_amp_args, apex_amp_getters, apex_state_params
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
GETTER = FIXTURES / "AMP101" / "amp_from_getter.project"


def _getters(source: str):
    return apex_amp_getters(ast.parse(source))


def test_a_function_returning_apex_amp_or_none_is_a_getter():
    assert _getters("def g(fp16):\n    if fp16:\n        from apex import amp\n    else:\n        amp = None\n    return amp\n") == ["g"]
    assert _getters("def g():\n    import apex.amp as amp\n    return amp\n") == ["g"]
    assert _getters("def g(on):\n    from apex import amp as a\n    if not on:\n        return None\n    return a\n") == ["g"]
    assert summarize((GETTER / "nlp" / "torch_utils.py").read_bytes(), "nlp").apex_amp_getters == ["get_amp"]


def test_other_returns_are_not_getters():
    assert _getters("def g(amp):\n    return amp\n") == []  # a parameter
    assert _getters("from apex import amp\ndef g():\n    return amp\n") == []  # not bound in the function
    assert _getters("def g():\n    from apex import amp\n    amp = wrap(amp)\n    return amp\n") == []
    assert _getters("def g():\n    from apex import amp\n    return amp or torch\n") == []
    assert _getters("def g():\n    from audio import amp\n    return amp\n") == []
    assert _getters("def g():\n    from .apex import amp\n    return amp\n") == []  # a local package
    assert _getters("def g():\n    global amp\n    from apex import amp\n    return amp\n") == []
    assert _getters("def g():\n    from apex import amp\n    yield amp\n") == []
    assert _getters("def g():\n    return None\n") == []  # never the module
    assert _getters("class C:\n    def g(self):\n        from apex import amp\n        return amp\n") == []


def test_fix_leaves_the_helper_uses_alone(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(GETTER, project)
    before = (project / "nlp" / "trainer.py").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "."],
        cwd=project,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (project / "nlp" / "trainer.py").read_bytes() == before, done.stdout + done.stderr
    assert "the fix does not make yet" in subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", "--no-cache", "--select", "AMP101", "."],
        cwd=project,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def test_parameters_used_only_for_amp_state():
    found = apex_state_params(
        ast.parse(
            "def load(path, model=None, amp=None):\n"
            "    model.load_state_dict(path)\n    model.cuda()\n"
            "    if amp is not None and path:\n        amp.load_state_dict(path)\n"
            "class K:\n    def save(self, amp, *, handle):\n"
            "        return {'a': amp.state_dict() if amp else None, 'h': handle.state_dict()}\n"
            "def keep(amp):\n    amp.state_dict()\n    return amp\n"
            "def other(amp):\n    amp.scale_loss(1, 2)\n"
        )
    )
    assert found == {"load": [("amp", 2)], "K.save": [("amp", 1), ("handle", -1)]}


def test_a_parameter_handed_on_to_a_state_parameter_is_one_too():
    """A relay (hqa_jukebox's `dump_checkpoint_on_kill(..., amp=None)`, whose signal handler calls
    `save_checkpoint(..., amp, ...)`): by position or keyword, through a nested function; a
    parameter handed elsewhere, or to another parameter, is not."""
    found = apex_state_params(
        ast.parse(
            "def save(path, model, amp=None):\n    if amp is not None:\n        torch.save(amp.state_dict(), path)\n"
            "def on_kill(model, path, amp=None):\n    def handler(signum, frame):\n        save(path, model, amp)\n"
            "    signal.signal(15, handler)\n"
            "def by_keyword(path, amp):\n    on_kill(None, path, amp=amp)\n"
            "def wrong_slot(path, amp):\n    save(amp, None)\n"
            "def elsewhere(amp):\n    print(amp)\n    save('x', None, amp)\n"
        )
    )
    assert found == {"save": [("amp", 2)], "on_kill": [("amp", 2)], "by_keyword": [("amp", 1)]}


def test_calls_handing_apex_amp_record_position_and_keyword():
    from ampmigrate.engine.project_index import _dotted

    def args(source):
        return apex_amp_args(ast.parse(source), _dotted)

    assert args("from apex import amp\nf(a, amp)\ng.h(x, amp=amp)\nk(*xs, amp)\nm(amp=other)\n") == [
        ("f", 2, 1, ""),
        ("g.h", 3, -1, "amp"),
    ]
    # neural_sp: `amp, scaler = None, None`, then the import under `if fp16:`.
    assert args("def main(fp16):\n    amp, s = None, None\n    if fp16:\n        from apex import amp\n    load(p, amp=amp)\n") == [
        ("load", 5, -1, "amp")
    ]
    # a `global amp` bound in another function (CookieTTS's HiFiGAN trainer)
    assert args("def setup(fp16):\n    global amp\n    if fp16:\n        from apex import amp\n    else:\n        amp = None\n"
                "def train():\n    step(amp)\n") == [("step", 8, 0, "")]
    assert args("from apex import amp\ndef f(amp):\n    g(amp=amp)\n") == []  # a parameter
    assert args("def f():\n    from apex import amp\ndef g():\n    amp = Mixer()\n    h(amp=amp)\n") == []
    assert args("from apex import amp\namp = wrap(amp)\nh(amp)\n") == []


def test_the_rules_through_a_value_leave_runs_without_the_facts(tmp_path):
    from ampmigrate.engine.pipeline import Engine
    from ampmigrate.engine.project_index import ProjectIndex

    from conftest import make_settings

    (tmp_path / "train.py").write_text("import torch\nmodel = build()\nmodel.load_state_dict(torch.load('m.pt'))\n")
    plain = ProjectIndex.build(str(tmp_path), [str(tmp_path / "train.py")])
    names = {type(rule).__name__ for rule in Engine(make_settings({"select": ["AMP1"]}), index=plain).rules}
    assert "ApexAmpFromHelper" not in names and "ApexAmpPassedIn" not in names
    files = sorted(str(p) for p in GETTER.rglob("*.py"))
    with_getter = ProjectIndex.build(str(GETTER), files)
    names = {type(rule).__name__ for rule in Engine(make_settings({"select": ["AMP1"]}), index=with_getter).rules}
    assert "ApexAmpFromHelper" in names
