"""`amp.initialize` inside a `try` or a loop (rules/apex/_init_enclosure.py).

The fixtures tests/fixtures/AMP101/tryloop_*.py (written from scratch) hold the shapes: a `try`
whose handler returns, exits or `continue`s the fold loop (migrated: code after it runs only when
the call ran), a k-fold loop making a new model and optimizer per fold (migrated: a new GradScaler
per fold, as apex made new loss scalers at each call), and the refusals: a handler that falls
through, the same optimizer at every iteration, a call under a test the loop changes, a use after
the loop, a use before the call in the iteration, a call in an `except` handler. Here: the
reasons, where the scaler lands, and edits of the fixtures that must flip the verdict.
"""

from __future__ import annotations

import pytest

from conftest import FIXTURES, check, fix

DIR = FIXTURES / "AMP101"


def _read(name: str) -> str:
    return (DIR / f"{name}.py").read_text()


def _reasons(code: str):
    return {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}


def _migrated(code: str) -> str:
    migrated = fix(code, select=["AMP1"])
    assert "amp.initialize(" not in migrated and "amp.scale_loss(" not in migrated, migrated
    compile(migrated, "migrated.py", "exec")
    assert fix(migrated, select=["AMP1"]) == migrated  # a second fix changes nothing
    return migrated


def _refused(code: str, *phrases: str) -> None:
    reasons = _reasons(code)
    assert reasons and all(r and all(p in r for p in phrases) for r in reasons), reasons


@pytest.mark.parametrize(
    "name, phrases",
    [
        ("tryloop_try_falls_through", ("the `except` at line 12 falls through", "line 17")),
        ("tryloop_loop_same_optimizer", ("not made anew in the iteration", "should only be passed through amp.initialize once")),
        ("tryloop_loop_init_once", ("`if epoch == args.start_epoch`", "changes `epoch`")),
        ("tryloop_loop_use_after", ("line 18 uses the scaler after the loop at line 8",)),
        ("tryloop_while_use_before", ("line 22 uses the scaler before `amp.initialize` (line 25)",)),
        ("tryloop_init_in_handler", ("in an `except` handler (line 12)",)),
    ],
)
def test_refusals_say_why(name, phrases):
    _refused(_read(name), *phrases)


def test_kfold_makes_a_new_scaler_in_each_fold():
    migrated = _migrated(_read("tryloop_kfold_helper"))
    loop = migrated.split("    for fold, loader in enumerate(folds):\n")[1]
    assert loop.index('scaler = torch.amp.GradScaler("cuda")') < loop.index("for epoch in range(epochs):")
    assert "train_one_epoch(model, optimizer, loader, scaler=scaler)" in loop


def test_kfold_script_keeps_the_flag_per_fold():
    migrated = _migrated(_read("tryloop_kfold_script"))
    fold = migrated.split("for fold in range(args.folds):\n")[1]
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)' in fold  # inside the loop, each fold


def test_try_whose_handler_gives_up_goes_with_the_import():
    migrated = _migrated(_read("tryloop_try_handler_returns"))
    assert "try:" not in migrated and "from apex" not in migrated
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))' in migrated


@pytest.mark.parametrize(
    "handler",
    [
        '        sys.exit(1)\n',
        '        exit(1)\n',
        '        raise\n',
        '        if err.args:\n            return\n        else:\n            raise SystemExit(2)\n',
        '        with open("log.txt", "a") as log:\n            log.write(str(err))\n            return\n',
    ],
)
def test_handlers_that_leave(handler):
    code = _read("tryloop_try_unconditional").replace("        sys.exit(1)\n", handler)
    _migrated(code)


@pytest.mark.parametrize(
    "handler",
    [
        "        pass\n",
        "        if err.args:\n            return\n",  # no `else`: falls through when the test is false
        "        for _ in range(3):\n            break\n",  # leaves the inner loop only
        "        try:\n            return\n        except ValueError:\n            pass\n",
    ],
)
def test_handlers_that_fall_through_keep_refusing(handler):
    code = _read("tryloop_try_unconditional").replace("        sys.exit(1)\n", handler)
    _refused(code, "falls through")


INSIDE_TRY = """\
import torch
import torch.nn.functional as F
from apex import amp


def train(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    except RuntimeError as err:
        print("training failed:", err)
    print("done")
"""


def test_a_use_inside_the_try_after_the_call_needs_no_leaving_handler():
    migrated = _migrated(INSIDE_TRY)
    assert '    try:\n        scaler = torch.amp.GradScaler("cuda")\n' in migrated


def test_a_use_in_the_handler_refuses():
    code = INSIDE_TRY.replace(
        '        print("training failed:", err)\n',
        '        print("training failed:", err)\n        torch.save(amp.state_dict(), "amp.pt")\n',
    )
    _refused(code, "line 18 uses the scaler where `amp.initialize` (line 9) has not run")


@pytest.mark.parametrize(
    "edit, phrase",
    [
        # the epoch function also runs before the fold's setup
        (
            ("        model = Net().cuda()\n", "        train_one_epoch(model, optimizer, loader)\n        model = Net().cuda()\n"),
            "before `amp.initialize`",
        ),
        # and after the fold loop
        (
            ('        torch.save(model.state_dict(), f"fold{fold}.pt")\n',
             '        torch.save(model.state_dict(), f"fold{fold}.pt")\n    train_one_epoch(model, optimizer, folds[0])\n'),
            "after the loop",
        ),
        # the optimizer is made under an `if` only
        (
            ("        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
             "        if fold == 0:\n            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"),
            "not made anew",
        ),
        # the epoch function is also called from another function
        (
            ("def run(folds, epochs):\n", "def finetune(model, optimizer, loader):\n    train_one_epoch(model, optimizer, loader)\n\n\ndef run(folds, epochs):\n"),
            "",
        ),
    ],
)
def test_kfold_edits_that_refuse(edit, phrase):
    code = _read("tryloop_kfold_helper")
    assert edit[0] in code
    _refused(code.replace(edit[0], edit[1]), phrase)


def test_kfold_script_flag_that_the_loop_changes():
    code = _read("tryloop_kfold_script").replace("    if args.fp16:\n        model, optimizer", "    if args.fp16 and fold < 2:\n        model, optimizer")
    _refused(code, "changes `fold`")


def test_kfold_script_epoch_function_used_as_a_value():
    code = _read("tryloop_kfold_script").replace(
        "for fold in range(args.folds):\n", "STEPS = [train_one_epoch]\nfor fold in range(args.folds):\n"
    )
    _refused(code, "used as a value")


def test_kfold_optimizer_made_in_the_call():
    code = _read("tryloop_kfold_helper").replace(
        "        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        '        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
        '        model, optimizer = amp.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-3), opt_level="O1")\n',
    )
    assert "torch.optim.Adam(model.parameters(), lr=1e-3), opt_level" in code
    _migrated(code)


def test_flag_outside_the_loop_would_hoist_the_scaler_out_of_it():
    # `if fp16:` around the whole fold loop, the epoch function using apex unconditionally: the
    # scaler would be made once before the loop (its `enabled` is that test).
    code = _read("tryloop_kfold_helper").replace("def run(folds, epochs):\n", "def run(folds, epochs, fp16=True):\n")
    code = code.replace("    for fold, loader in enumerate(folds):\n", "    if not fp16:\n        return\n    for fold, loader in enumerate(folds):\n")
    _migrated(code)  # an early return is no `if` around the call
    body = _read("tryloop_kfold_helper").split("def run(folds, epochs):\n")[1]
    nested = "\n".join(("    " + line) if line else line for line in body.splitlines())
    code = _read("tryloop_kfold_helper").split("def run(folds, epochs):\n")[0] + "def run(folds, epochs, fp16=True):\n    if fp16:\n" + nested + "\n"
    _refused(code, "the scaler would be made once before the loop")


def test_while_loop_making_a_new_setup_each_iteration():
    code = _read("tryloop_kfold_helper").replace(
        "    for fold, loader in enumerate(folds):\n",
        "    fold = 0\n    while fold < len(folds):\n        loader = folds[fold]\n",
    ).replace('        torch.save(model.state_dict(), f"fold{fold}.pt")\n', '        torch.save(model.state_dict(), f"fold{fold}.pt")\n        fold += 1\n')
    migrated = _migrated(code)
    loop = migrated.split("    while fold < len(folds):\n")[1]
    assert 'scaler = torch.amp.GradScaler("cuda")' in loop


def test_nested_loops_need_a_new_optimizer_in_the_inner_one():
    # a repeat per seed inside the fold loop, the optimizer made per fold only: the second seed
    # would pass apex's patched optimizer again
    code = _read("tryloop_kfold_helper").replace(
        '        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n        for epoch in range(epochs):\n'
        "            train_one_epoch(model, optimizer, loader)\n",
        "        for seed in range(2):\n"
        '            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "            for epoch in range(epochs):\n"
        "                train_one_epoch(model, optimizer, loader)\n",
    )
    assert "for seed in range(2):" in code
    _refused(code, "the loop at line 26", "not made anew")


def test_a_match_case_around_the_call_refuses():
    code = _read("tryloop_kfold_helper").replace(
        "        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        '        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
        "        match fold:\n"
        "            case 0:\n"
        "                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        '                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
    )
    assert "case 0:" in code
    _refused(code, "runs inside a `MatchCase`")


def test_kfold_optimizer_rebound_to_an_old_object():
    code = _read("tryloop_kfold_helper").replace(
        "def run(folds, epochs):\n", "def run(folds, epochs, shared=None):\n"
    ).replace("        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n", "        optimizer = shared\n")
    assert "optimizer = shared" in code
    _refused(code, "not made anew")


def test_a_repeat_in_a_loop_the_first_call_is_not_in_is_refused():
    """apex made its loss scalers anew at each call: a repeat on every pass of a loop is no
    re-initialization that one GradScaler made by the first call could stand for."""
    code = (
        "import torch\nfrom apex import amp\n\n\n"
        "def train(model, optimizer, loaders):\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "    for loader in loaders:\n"
        '        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "        for x, y in loader:\n"
        "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "            optimizer.zero_grad()\n"
        "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "                scaled_loss.backward()\n"
        "            optimizer.step()\n"
    )
    reasons = {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}
    assert any("runs again on each pass of the loop at line 7" in (r or "") for r in reasons), reasons
    # the same repeat after the loop (a resume path) is still one setup
    after = code.replace("    for loader in loaders:\n        model, optimizer = amp.initialize", "    model, optimizer = amp.initialize").replace(
        "        for x, y in loader:\n", "    for loader in loaders:\n        for x, y in loader:\n"
    )
    assert "amp.initialize" not in fix(after, select=["AMP1"])


_SEARCH_CLASS = '''
import torch
from apex import amp


class Trainer:
    def __init__(self, config):
        self.config = config

    def train(self):
        for trial in range(self.config["trials"]):
            self.model = torch.nn.Linear(4, 2)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
            {setup}
            self.execute()

    def execute(self):
        for x in self.config["data"]:
            loss = self.model(x).sum()
            with amp.scale_loss(loss, self.opt) as scaled:
                scaled.backward()
            self.opt.step()
'''


def test_a_scaler_attribute_is_made_at_each_iteration_of_a_method_loop():
    """intra_batch's search loop: `self.scaler` made where `amp.initialize` was, at each trial,
    with a disabled default in `__init__`."""
    migrated = _migrated(_SEARCH_CLASS.format(setup='self.model, self.opt = amp.initialize(self.model, self.opt, opt_level="O1")'))
    assert '        self.scaler = torch.amp.GradScaler("cuda", enabled=False)\n' in migrated
    trial = migrated.split("        for trial in range(self.config[\"trials\"]):\n")[1]
    assert trial.index('self.scaler = torch.amp.GradScaler("cuda")') < trial.index("self.execute()")


def test_a_scaler_attribute_set_up_in_a_try_that_falls_through_refuses():
    setup = 'try:\n                self.model, self.opt = amp.initialize(self.model, self.opt, opt_level="O1")\n' \
        '            except RuntimeError:\n                print("no apex")'
    _refused(_SEARCH_CLASS.format(setup=setup), "the scaler would live on an object whose methods may run apart from it")
