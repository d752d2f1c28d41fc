"""An input gradient's helper in another file, handed the optimizer by a script that scales its own
losses (engine/apex_input_gradients.py facts, rules/apex/_input_gradient_threading.py migration).

The shape of locuslab/fast_adversarial's `utils.attack_pgd(..., opt=None)` and its many copies:
the helper scales with apex only when given an optimizer, and never steps it. The fixture
tests/fixtures/AMP101/apex_input_gradient.project is written from scratch: `attacks.py` (the
helper, and an evaluation calling it without an optimizer) and `train.py` (apex set up, the
helper called in each training step, then the script's own scaled step). Before this, both files
refused: "files that scale a loss themselves are not threaded to another file".
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from ampmigrate.engine.apex_input_gradients import input_gradient_problem
from ampmigrate.engine.apex_threading import decide
from ampmigrate.engine.project_index import ProjectIndex, summarize

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _fix

PROJECT = FIXTURES / "AMP101" / "apex_input_gradient.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def _index(project: Path) -> ProjectIndex:
    return ProjectIndex.build(str(project), sorted(str(p) for p in project.rglob("*.py")))


def test_the_facts_name_the_helper_and_the_call_handing_it_the_optimizer():
    helper = summarize((PROJECT / "attacks.py").read_bytes(), "")
    assert helper.apex_gradient_functions == ["fgsm_direction"]
    assert helper.apex_step_functions["fgsm_direction"] == (["model", "x", "y", "eps", "opt"], "opt", "scaler", "")
    script = summarize((PROJECT / "train.py").read_bytes(), "")
    assert script.apex_gradient_calls == [("fgsm_direction", 25, 4, "")]
    assert script.apex_step_functions == {} and script.apex_init_function == ""  # not the split shape's A side


def test_both_sides_decide_to_migrate(tmp_path):
    project = _copy(tmp_path)
    decision = decide(_index(project), str(project / "attacks.py"), "fgsm_direction")
    assert decision.migrate and decision.callers == ("train.py",) and decision.scaler == "scaler"


def test_fix_threads_the_scaler_to_the_helper(tmp_path):
    project = _copy(tmp_path)
    output = _fix(project)
    helper = (project / "attacks.py").read_text()
    script = (project / "train.py").read_text()
    assert not any(apex in helper + script for apex in ("from apex", "amp.scale_loss", "amp.initialize")), output
    assert "def fgsm_direction(model, x, y, eps, opt=None, *, scaler=None):\n" in helper
    assert (
        '    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None and scaler.is_enabled()):\n'
        "        logits = model(x + delta)\n"
        "        loss = F.cross_entropy(logits, y)\n"
        "    if opt is not None:\n"
        "        scaler.scale(loss).backward()\n"
        "    else:\n"
        "        loss.backward()\n"
    ) in helper
    assert "scaler.step" not in helper and "scaler.update" not in helper  # the helper steps nothing
    # the evaluation's call gives no optimizer, hence no scaler: it stays as it was
    assert "    adversarial = x + fgsm_direction(model, x, y, eps)\n" in helper
    assert '    scaler = torch.amp.GradScaler("cuda")\n' in script
    # the helper's call is no part of the step's autocast region: the helper has its own
    assert (
        "        delta = fgsm_direction(model, x, y, args.eps, opt, scaler=scaler)\n"
        '        with torch.autocast("cuda", dtype=torch.float16):\n'
        "            logits = model(x + delta)\n"
    ) in script
    assert "        scaler.scale(loss).backward()\n        scaler.step(opt)\n        scaler.update()\n" in script
    _compiles_and_is_stable(project)


def test_an_evaluation_script_calling_the_helper_without_an_optimizer_does_not_stop_it(tmp_path):
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(
        "from attacks import fgsm_direction\n\n\ndef score(model, x, y):\n"
        "    return (model(x + fgsm_direction(model, x, y, 0.1)).argmax(1) == y).float().mean()\n"
    )
    _fix(project)
    assert "scaler=None" in (project / "attacks.py").read_text()
    assert "fgsm_direction(model, x, y, 0.1)" in (project / "evaluate.py").read_text()


@pytest.mark.parametrize(
    "caller, why",
    [
        # an optimizer from a file with no apex: no GradScaler there to pass with it
        ("def attack(model, x, y, opt):\n    return fgsm_direction(model, x, y, 0.1, opt)\n",
         "hands `fgsm_direction()` an optimizer, but not from the function calling its `amp.initialize`"),
        # apex set up, but no loss scaled here: an evaluation script (the split shape's A side)
        ("import torch\nfrom apex import amp\n\n\ndef evaluate(model, x, y):\n"
         "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         '    model, opt = amp.initialize(model, opt, opt_level="O1")\n'
         "    return fgsm_direction(model, x, y, 0.1, opt)\n",
         "in a file that also scales its own losses"),
        # a value that is no call: the new parameter cannot follow it
        ("ATTACKS = [fgsm_direction]\n", "uses `fgsm_direction()` otherwise than by calling it"),
    ],
)
def test_a_caller_that_cannot_pass_the_scaler_stops_both_sides(tmp_path, caller, why):
    project = _copy(tmp_path)
    (project / "other.py").write_text("from attacks import fgsm_direction\n\n\n" + caller)
    before = {p.name: p.read_text() for p in project.glob("*.py")}
    output = _fix(project)
    assert {p.name: p.read_text() for p in project.glob("*.py")} == before, output
    decision = decide(_index(project), str(project / "attacks.py"), "fgsm_direction")
    assert not decision.migrate and why in decision.reason


def _problem(source: str) -> str:
    tree = ast.parse(textwrap.dedent(source))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grad")
    scales = [n for n in ast.walk(function) if isinstance(n, ast.Attribute) and n.attr == "scale_loss"]
    return input_gradient_problem(tree, function, "opt", scales)


GUARDED = """
def grad(model, x, opt=None):
    loss = model(x).sum()
    if opt is not None:
        with amp.scale_loss(loss, opt) as s:
            s.backward()
    else:
        loss.backward()
    return x.grad
"""


def test_the_shape_is_the_guarded_optional_optimizer():
    assert _problem(GUARDED) == ""
    assert _problem(GUARDED.replace("if opt is not None:", "if opt:")) == ""
    assert _problem(GUARDED + "\n\ndef evaluate(model, x):\n    return grad(model, x)\n") == ""


@pytest.mark.parametrize(
    "change, why",
    [
        (("opt=None", "opt"), "is not optional"),
        (("opt=None", "opt=False"), "is not optional"),
        (("if opt is not None:", "if True:"), "is not under `if opt is not None:`"),
        (("if opt is not None:", "if opt is None:"), "is not under `if opt is not None:`"),
        (("    return x.grad", "    opt.zero_grad()\n    return x.grad"), "uses `opt` otherwise than to scale the loss"),
    ],
)
def test_other_shapes_keep_a_reason(change, why):
    assert why in _problem(GUARDED.replace(*change))


def test_its_own_file_may_call_it_only_without_the_optimizer():
    calling = GUARDED + "\n\ndef train(model, x, optimizer):\n    return grad(model, x, optimizer)\n"
    assert "called with an optimizer in its own file" in _problem(calling)
    keyword = GUARDED + "\n\ndef train(model, x, optimizer):\n    return grad(model, x, opt=optimizer)\n"
    assert "called with an optimizer in its own file" in _problem(keyword)
    assert "otherwise than by calling it" in _problem(GUARDED + "\nHELPERS = [grad]\n")


def test_a_cached_verdict_on_the_helper_follows_the_script(tmp_path):
    """The helper's result depends on how the script calls it (engine/apex_threading.threading_key
    folds the script's `apex_gradient_calls` in): a warm run after the script changes decides again."""
    import subprocess
    import sys

    project = _copy(tmp_path)

    def check() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ampmigrate", "check", "--exit-zero", "--select", "AMP101", "--output-format", "json",
             "--cache-dir", str(tmp_path / "cache"), "."],
            cwd=project, env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=False,
        )
        return done.stdout

    assert '"no_fix_reason": null' in check() and "no_fix_reason\": \"" not in check()  # cold, then warm
    # the script now hands the helper the optimizer inside a nested function: no longer followed
    script = (project / "train.py").read_text()
    (project / "train.py").write_text(script.replace(
        "        delta = fgsm_direction(model, x, y, args.eps, opt)\n",
        "        attack = lambda: fgsm_direction(model, x, y, args.eps, opt)\n        delta = attack()\n",
    ))
    import json

    helper = [f for f in json.loads(check()) if f["filename"].endswith("attacks.py")]
    assert helper and helper[0]["fix"] is None  # the helper's cached fix does not stand
    assert "hands `fgsm_direction()` an optimizer, but not from the function calling its `amp.initialize`" in helper[0]["no_fix_reason"]
