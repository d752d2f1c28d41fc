"""`amp.initialize(model, opt, **amp_args)` with the dict built right before the call
(rules/apex/_keyword_dict.py), and a training script that hands its optimizer to another file's
apex-scaling function (`_Planner._check_scaled_elsewhere`).

The golden fixtures tests/fixtures/AMP101/initialize_keyword_dict.py (a key stored under an `if`),
initialize_keyword_literal.py (a literal dict, a key stored again) and
initialize_keyword_dict_read_elsewhere.py (refused) show the rewrites; the cases below are the
shapes the expansion must refuse, each a one-line change of the first fixture.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, make_settings

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (FIXTURES / "AMP101" / "initialize_keyword_dict.py").read_text()
DICT = "    amp_args = dict(opt_level=args.opt_level, loss_scale=args.loss_scale, verbosity=False)\n"
STORE = '    if args.opt_level == "O2":\n        amp_args["master_weights"] = args.master_weights\n'
CALL = "    model, opt = amp.initialize(model, opt, **amp_args)\n"
EXPANDED_REASON = "its keywords come from `**amp_args`, which the fix reads only when it is a dict"


def _fix(text: str):
    engine = Engine(make_settings({"select": ["AMP1"]}))
    return engine.fix_text(text, "train.py")


def _reasons(text: str):
    engine = Engine(make_settings({"select": ["AMP1"]}))
    return {f.no_fix_reason for f in engine.check_text(text, "train.py").findings if f.no_fix_reason}


def test_the_dict_and_its_conditional_store_become_the_calls_keywords_and_go():
    assert SOURCE.count(DICT) == 1 and SOURCE.count(STORE) == 1 and SOURCE.count(CALL) == 1
    new = _fix(SOURCE).new_text
    assert "amp_args" not in new and "from apex" not in new and "amp." not in new.replace("torch.amp.", "")
    # a key stored only under O2 is checked only under O2 (apex's default for it is None)
    assert '    if args.opt_level == "O2" and args.master_weights not in (None, True):\n' in new
    assert "init_scale=65536.0 if args.loss_scale in (None, \"dynamic\") else float(args.loss_scale)" in new


@pytest.mark.parametrize(
    "old, new",
    [
        # a statement between the dict and the call: it might change what the values read
        (CALL, "    args.loss_scale = 1.0\n" + CALL),
        # a value read again later would not be the value stored (a call has effects)
        (DICT, DICT.replace("verbosity=False", "verbosity=quiet()")),
        # a key under a test whose apex default is not None (`enabled=True`)
        (STORE, STORE.replace('"master_weights"', '"enabled"')),
        # an `else:` arm stores too
        (STORE, STORE + "    else:\n        amp_args[\"master_weights\"] = True\n"),
        # the same keyword given twice raises TypeError: no call that ran
        (CALL, CALL.replace("opt, **amp_args", "opt, verbosity=0, **amp_args")),
        # the dict is not built here
        (DICT, "    amp_args = make_options(args)\n"),
        # a computed key
        (STORE, STORE.replace('"master_weights"', "key")),
    ],
)
def test_what_the_expansion_refuses(old, new):
    text = SOURCE.replace(old, new, 1)
    assert text != SOURCE
    reasons = _reasons(text)
    assert any(EXPANDED_REASON in r for r in reasons), reasons
    assert _fix(text).new_text in (None, text)


PROJECT = {
    "utils.py": (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from apex import amp\n\n\n"
        "def attack(model, x, y, opt=None):\n"
        "    delta = torch.zeros_like(x).requires_grad_()\n"
        "    loss = F.cross_entropy(model(x + delta), y)\n"
        "    if opt is not None:\n"
        "        with amp.scale_loss(loss, opt) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "    else:\n"
        "        loss.backward()\n"
        "    return delta.grad.sign()\n"
    ),
    "train.py": (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from apex import amp\n\n"
        "from utils import attack\n\n\n"
        "def main(loader):\n"
        "    model = torch.nn.Linear(8, 2).cuda()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        '    model, opt = amp.initialize(model, opt, opt_level="O1")\n'
        "    for x, y in loader:\n"
        "        loss = F.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n"
        "        with amp.scale_loss(loss, opt) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        opt.step()\n"
        "    return attack(model, x, y, opt)\n"
    ),
}


def _run(project: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", *args, "--no-cache", "--exit-zero", "."],
        cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
    )
    return done.stdout + done.stderr


# The attack scaling with a required optimizer, unguarded: no input gradient's helper that takes
# an optional scaler (engine/apex_input_gradients.py; the optional, guarded one migrates with
# the script: tests/test_apex_input_gradient.py).
REQUIRED = {
    "utils.py": PROJECT["utils.py"].replace("def attack(model, x, y, opt=None):", "def attack(model, x, y, opt):").replace(
        "    if opt is not None:\n        with amp.scale_loss(loss, opt) as scaled_loss:\n            scaled_loss.backward()\n"
        "    else:\n        loss.backward()\n",
        "    with amp.scale_loss(loss, opt) as scaled_loss:\n        scaled_loss.backward()\n",
    ),
    "train.py": PROJECT["train.py"],
}


def test_a_script_handing_its_optimizer_to_another_files_scaled_backward_is_not_migrated_alone(tmp_path):
    assert REQUIRED["utils.py"] != PROJECT["utils.py"] and "if opt" not in REQUIRED["utils.py"]
    for name, text in REQUIRED.items():
        (tmp_path / name).write_text(text)
    report = _run(tmp_path, "check", "--select", "AMP1")
    assert "line 18 hands the optimizer to `attack()` of utils.py, which scales a loss with apex's amp" in report
    _run(tmp_path, "fix")
    assert (tmp_path / "train.py").read_text() == PROJECT["train.py"]


def test_without_the_optimizer_handed_on_the_script_migrates(tmp_path):
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text.replace("attack(model, x, y, opt)", "attack(model, x, y)"))
    _run(tmp_path, "fix")
    train = (tmp_path / "train.py").read_text()
    assert "torch.amp.GradScaler" in train and "apex" not in train


def test_a_cached_verdict_follows_the_other_file_imported_as_a_module(tmp_path):
    project = {
        "utils.py": REQUIRED["utils.py"],
        "train.py": REQUIRED["train.py"].replace("from utils import attack\n", "import utils\n").replace(
            "return attack(", "return utils.attack("
        ),
    }
    for name, text in project.items():
        (tmp_path / name).write_text(text)

    def check() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ampmigrate", "check", "--exit-zero", "--select", "AMP1", "--cache-dir", str(tmp_path / "cache"), "train.py", "utils.py"],
            cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
        )
        return done.stdout

    assert "hands the optimizer to `attack()` of utils.py" in check()
    # utils.attack no longer scales with apex: the cached verdict on train.py must not stand
    (tmp_path / "utils.py").write_text(
        REQUIRED["utils.py"].replace("from apex import amp\n", "").replace(
            "    with amp.scale_loss(loss, opt) as scaled_loss:\n        scaled_loss.backward()\n", "    loss.backward()\n"
        )
    )
    assert "hands the optimizer" not in check()
