"""apex set up in a helper function that returns the model and optimizer, the loss scaled by its
callers (DPR's `setup_for_distributed_mode`, `build_and_initialize_model_and_optimizer` helpers):
engine/apex_setup_helper.py has the facts, rules/apex/_setup_helper.py the migration.

The fixtures tests/fixtures/AMP101/apex_setup_helper.project (the helper in `model_setup.py`, the
training in `train.py`) and apex_setup_helper_same_file.project (both in one file, the scaler
passed down two functions) are written from scratch. The helper keeps its signature and returns;
its `amp.initialize` goes; the caller creates `torch.amp.GradScaler("cuda", enabled=<the helper's
test, in the caller's terms>)` right after the call. Every caller migrates, or none does.
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from ampmigrate.engine.apex_setup_helper import helper_callers, helper_of

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused

HELPER = FIXTURES / "AMP101" / "apex_setup_helper.project"
SAME_FILE = FIXTURES / "AMP101" / "apex_setup_helper_same_file.project"


O3_GUARD = 'raise ValueError("apex opt_level O3 (pure fp16) has no torch.amp equivalent; use O1 or O2")'


def _apex_free(text: str) -> bool:
    """No apex left (the O3 guard's message names apex)."""
    return "apex" not in text.replace(O3_GUARD, "")


def _copy(tmp_path: Path, source: Path = HELPER) -> Path:
    project = tmp_path / "p"
    shutil.copytree(source, project)
    return project


def test_the_helper_is_described_from_its_file():
    path = str(HELPER / "model_setup.py")
    helper, why = helper_of(ast.parse((HELPER / "model_setup.py").read_text()), path)
    assert why == "" and helper is not None
    assert (helper.name, helper.params, helper.returns, helper.model_index, helper.optimizer_index) == (
        "prepare", ["model", "optimizer", "device", "fp16", "opt_level"], 2, 0, 1
    )
    assert [(ast.unparse(t), taken) for t, taken in helper.tests] == [("fp16", True)]
    assert ast.unparse(helper.options["opt_level"]) == "opt_level"


def test_the_callers_are_the_files_calling_it(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    callers, reason = helper_callers(index, str(project / "model_setup.py"), "prepare")
    assert reason == "" and callers == [str(project / "train.py")]


def test_fix_creates_the_scaler_after_the_helper_call(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    a = (project / "model_setup.py").read_text()
    b = (project / "train.py").read_text()
    assert _apex_free(a + b) and "amp.initialize" not in a
    # the helper keeps its signature and its return
    assert 'def prepare(model: nn.Module, optimizer, device, fp16=False, opt_level="O1"):\n' in a
    assert "    return model, optimizer\n" in a
    assert (
        '    net, opt = prepare(net, opt, "cuda", fp16=args.fp16, opt_level="O1")\n'
        '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n'
    ) in b
    assert (
        '        with torch.autocast("cuda", dtype=torch.float16, enabled=args.fp16):\n'
        "            output = net(x)\n"
        "            loss = criterion(output, y)\n"
    ) in b
    assert "            scaler.scale(loss).backward()\n" in b
    assert "        scaler.step(opt)\n        scaler.update()\n" in b
    _compiles_and_is_stable(project)


def test_same_file_helper_threads_the_scaler_from_its_caller(tmp_path):
    project = _copy(tmp_path, SAME_FILE)
    _fix(project)
    text = (project / "train.py").read_text()
    assert _apex_free(text) and "amp.initialize" not in text
    assert (
        "    model, optimizer = build_model_and_optimizer(args)\n"
        '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n'
    ) in text
    assert "def train_step(batch, model, optimizer, args, scaler):\n" in text
    assert "        train_epoch(loader, model, optimizer, args, scaler=scaler)\n" in text
    assert "        scaler.unscale_(optimizer)\n" in text
    assert "    return model, optimizer\n" in text
    _compiles_and_is_stable(project)


def test_the_test_reads_what_the_helper_assigns(tmp_path):
    """`args.fp16 = ...` in the helper before its test: the caller's `args.fp16` after the call may
    not be what the helper tested."""
    project = _copy(tmp_path, SAME_FILE)
    _edit(project / "train.py", "    args.start_epoch = 0\n", "    args.fp16 = args.fp16 and torch.cuda.is_available()\n")
    reasons = _refused(project)
    assert "assigns `args.fp16`, which its apex test reads" in reasons["train.py"]


def test_a_caller_that_cannot_migrate_stops_the_group(tmp_path):
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "import torch\nfrom apex import amp\nfrom model_setup import prepare\n\n\n"
        "def finetune(net, opt, fp16):\n"
        "    net, opt = prepare(net, opt, 'cuda', fp16=fp16)\n"
        "    net, opt = prepare(net, opt, 'cuda', fp16=fp16)\n"
        "    loss = net(torch.randn(2, 8)).sum()\n"
        "    with amp.scale_loss(loss, opt) as scaled:\n"
        "        scaled.backward()\n"
        "    opt.step()\n"
    )
    reasons = _refused(project)
    assert "`prepare()` is called 2 times in this file" in reasons["finetune.py"]
    assert "finetune.py cannot be migrated with it" in reasons["model_setup.py"]
    assert "finetune.py cannot be migrated with it" in reasons["train.py"]


def _loss_scale_parameter(project: Path) -> None:
    """The helper passes its own `loss_scale` parameter (default 'dynamic') to `amp.initialize`."""
    _edit(project / "model_setup.py", 'opt_level="O1"):', 'opt_level="O1", loss_scale="dynamic"):')
    _edit(project / "model_setup.py", "opt_level=opt_level)", "opt_level=opt_level, loss_scale=loss_scale)")


def test_a_static_loss_scale_refuses(tmp_path):
    project = _copy(tmp_path)
    _loss_scale_parameter(project)
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O1", loss_scale=128.0)')
    reasons = _refused(project)
    assert "the loss scale `prepare()` passes to `amp.initialize` is not 'dynamic' here" in reasons["train.py"]
    assert "train.py cannot be migrated with it" in reasons["model_setup.py"]


def test_the_default_dynamic_loss_scale_migrates(tmp_path):
    project = _copy(tmp_path)
    _loss_scale_parameter(project)
    _fix(project)
    assert _apex_free((project / "train.py").read_text() + (project / "model_setup.py").read_text())


def _float_or_dynamic_local(project: Path, test: str = 'settings.loss_scale != "dynamic"') -> None:
    """The helper reads the loss scale from a settings object, as ZenNAS's helper does: a local
    bound to `float(settings.loss_scale)` unless it is "dynamic"."""
    _edit(project / "model_setup.py", 'opt_level="O1"):', 'opt_level="O1", settings=None):')
    _edit(
        project / "model_setup.py",
        "        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)",
        f"        if {test}:\n"
        "            loss_scale = float(settings.loss_scale)\n"
        "        else:\n"
        '            loss_scale = "dynamic"\n'
        "        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, loss_scale=loss_scale)",
    )
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O1", settings=args)')


def test_a_run_time_loss_scale_read_from_an_argument_migrates(tmp_path):
    """`loss_scale = float(s.loss_scale) if s.loss_scale != "dynamic" else "dynamic"` is apex's own
    reading of `s.loss_scale`: the caller's scaler reads `args.loss_scale` at run time, as the
    in-file migration does."""
    project = _copy(tmp_path)
    _float_or_dynamic_local(project)
    _fix(project)
    b = (project / "train.py").read_text()
    assert _apex_free(b + (project / "model_setup.py").read_text())
    assert '        init_scale=65536.0 if args.loss_scale in (None, "dynamic") else float(args.loss_scale),\n' in b
    assert '        growth_interval=2000 if args.loss_scale in (None, "dynamic") else 2**31 - 1,\n' in b
    _compiles_and_is_stable(project)


def test_a_loss_scale_chosen_on_another_test_refuses(tmp_path):
    """The local is "dynamic" under a test of something else (`settings.static`): not apex's
    reading of `settings.loss_scale`, so the helper's scale stays unknown here."""
    project = _copy(tmp_path)
    _float_or_dynamic_local(project, test="settings.static")
    reasons = _refused(project)
    assert "the loss scale `prepare()` passes to `amp.initialize` is not 'dynamic' here" in reasons["train.py"]


@pytest.mark.parametrize(
    "binding, source",
    [
        ('s = float(a.scale) if a.scale != "dynamic" else "dynamic"', "a.scale"),
        ('s = "dynamic" if a.scale == "dynamic" else float(a.scale)', "a.scale"),
        ('s = a.scale if a.scale != "dynamic" else a.scale', "a.scale"),
        ('s = float(a.scale) if a.other != "dynamic" else "dynamic"', None),
        ('s = float(a.scale) if a.scale != "dynamic" else 128.0', None),
        ('s = int(a.scale) if a.scale != "dynamic" else "dynamic"', None),
    ],
)
def test_the_float_or_dynamic_idiom(binding, source):
    from ampmigrate.engine.apex_setup_helper import float_or_dynamic_source

    function = ast.parse(f"def f(a):\n    {binding}\n    return s\n").body[0]
    found = float_or_dynamic_source(function, "s")
    assert (ast.unparse(found) if found is not None else None) == source


def test_a_rebound_idiom_local_is_not_read(tmp_path):
    function = ast.parse(
        'def f(a):\n    s = float(a.scale) if a.scale != "dynamic" else "dynamic"\n    s *= 2\n    return s\n'
    ).body[0]
    from ampmigrate.engine.apex_setup_helper import float_or_dynamic_source

    assert float_or_dynamic_source(function, "s") is None


def _messages(project: Path) -> dict:
    """{file name: AMP101 fix message} before any fix."""
    from test_apex_threading import _check_json

    return {
        f["filename"].rsplit("/", 1)[-1]: (f.get("fix") or {}).get("message") or f["no_fix_reason"]
        for f in _check_json(project)
        if f["code"] == "AMP101"
    }


def test_a_run_time_opt_level_migrates_with_an_o3_guard_in_the_helper(tmp_path):
    """`opt_level=args.level`: as the in-file planner does, O0 disables the scaler and autocast (in
    the caller's terms), O1/O2 run fp16 autocast, and O3 raises in the helper where `amp.initialize` was."""
    project = _copy(tmp_path)
    _edit(project / "train.py", 'opt_level="O1")', "opt_level=args.level)")
    messages = _messages(project)
    assert "`args.level` (the opt level of `prepare()`) is known only at run time" in messages["train.py"]
    assert "O3 now raises where `amp.initialize` was" in messages["model_setup.py"]
    _fix(project)
    a = (project / "model_setup.py").read_text()
    b = (project / "train.py").read_text()
    assert _apex_free(a + b)
    assert f'    if fp16:\n        if opt_level == "O3":\n            {O3_GUARD}\n    if torch.cuda' in a
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.level != "O0")\n' in b
    assert '        with torch.autocast("cuda", dtype=torch.float16, enabled=args.fp16 and args.level != "O0"):\n' in b
    _compiles_and_is_stable(project)


def test_an_opt_level_chosen_between_o1_and_o0_enables_on_its_test(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O1" if args.steps > 1 else "O0")')
    _fix(project)
    b = (project / "train.py").read_text()
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.steps > 1)\n' in b
    _compiles_and_is_stable(project)


def test_a_literal_o3_refuses_the_group(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O3")')
    reasons = _refused(project)
    assert "the opt level `prepare()` passes to `amp.initialize` is ['O3'] here" in reasons["train.py"]
    assert "(train.py cannot be migrated with it: the opt level `prepare()` passes" in reasons["model_setup.py"]


EVALUATE = (
    "import torch\nfrom model_setup import prepare\n\n\n"
    "def evaluate(net, level):\n"
    "    net, _ = prepare(net, None, 'cuda', fp16=True, opt_level=level)\n"
    "    with torch.no_grad():\n"
    "        return net(torch.randn(2, 8))\n"
)


def test_an_inference_use_of_the_helper_migrates_with_the_group(tmp_path):
    """A caller giving the helper no optimizer trains nothing through it: it needs no scaler, and
    its model runs in fp32 once `amp.initialize` goes (the note says so), as the in-file planner
    drops an inference `amp.initialize`."""
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(EVALUATE)
    messages = _messages(project)
    assert (
        "evaluate.py calls `prepare()` for inference (no optimizer): without `amp.initialize` its model runs in fp32"
    ) in messages["model_setup.py"]
    _fix(project)
    assert (project / "evaluate.py").read_text() == EVALUATE
    assert "amp.initialize" not in (project / "model_setup.py").read_text()
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n' in (project / "train.py").read_text()
    _compiles_and_is_stable(project)


def test_an_inference_caller_with_an_optimizer_it_never_steps(tmp_path):
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(
        "import torch\nfrom model_setup import prepare\n\n\n"
        "def evaluate(net):\n"
        "    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    net, _ = prepare(net, optimizer, 'cuda', fp16=True)\n"
        "    return net(torch.randn(2, 8))\n"
    )
    assert "(an optimizer nothing steps)" in _messages(project)["model_setup.py"]
    _fix(project)
    assert "amp.initialize" not in (project / "model_setup.py").read_text()


def test_an_optimizer_stepped_by_a_caller_without_apex_refuses(tmp_path):
    """The caller trains with the optimizer the helper set up, but without `amp.scale_loss`."""
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "import torch\nfrom model_setup import prepare\n\n\n"
        "def finetune(net):\n"
        "    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    net, optimizer = prepare(net, optimizer, 'cuda', fp16=True)\n"
        "    net(torch.randn(2, 8)).sum().backward()\n"
        "    optimizer.step()\n"
    )
    reasons = _refused(project)
    assert "finetune.py calls `prepare()` and scales no loss with apex's amp itself, and it is not an inference use" in reasons["model_setup.py"]
    assert "line 7 gives the helper an optimizer the file may train with" in reasons["train.py"]


def test_an_inference_caller_casting_to_half_refuses(tmp_path):
    """apex's O2 model took fp16 inputs; without `amp.initialize` the fp32 model would not."""
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(EVALUATE.replace("net(torch.randn(2, 8))", "net(torch.randn(2, 8).half())"))
    reasons = _refused(project)
    assert "line 8 casts to half: without `amp.initialize` the helper's model stays fp32" in reasons["model_setup.py"]
    assert "evaluate.py calls `prepare()`" in reasons["train.py"]


def test_an_inference_caller_asking_for_o3_refuses(tmp_path):
    project = _copy(tmp_path)
    (project / "evaluate.py").write_text(EVALUATE.replace("opt_level=level", "opt_level='O3'"))
    reasons = _refused(project)
    assert "line 6 asks for O3 (pure fp16)" in reasons["model_setup.py"]


def test_a_cached_result_follows_a_new_inference_caller(tmp_path):
    """The index key of both sides folds in every file importing the helper's file: a caller added
    after a cached check changes the decision on the next run."""
    import json
    import subprocess
    import sys

    from test_apex_threading import ROOT

    project = _copy(tmp_path)
    cache = tmp_path / "cache"

    def reasons():
        done = subprocess.run(
            [sys.executable, "-m", "ampmigrate", "check", "--cache-dir", str(cache), "--exit-zero", "--select", "AMP101",
             "--output-format", "json", "."],
            cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
        )
        return {f["filename"].rsplit("/", 1)[-1]: f["no_fix_reason"] for f in json.loads(done.stdout)}

    assert not any(reasons().values())
    (project / "evaluate.py").write_text("from model_setup import prepare\n\nnet, _ = prepare(1, None, 'cuda', fp16=True)\nnet.half()\n")
    found = reasons()
    assert "evaluate.py calls `prepare()`" in found["model_setup.py"] and "evaluate.py calls `prepare()`" in found["train.py"]


def test_the_helper_imported_under_another_name_or_through_its_module(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train.py", "from model_setup import prepare\n", "import model_setup as ms\n")
    _edit(project / "train.py", "net, opt = prepare(", "net, opt = ms.prepare(")
    _fix(project)
    text = (project / "train.py").read_text()
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n' in text and _apex_free(text)
    project = tmp_path / "q"
    shutil.copytree(HELPER, project)
    _edit(project / "train.py", "from model_setup import prepare\n", "from model_setup import prepare as setup\n")
    _edit(project / "train.py", "net, opt = prepare(", "net, opt = setup(")
    _fix(project)
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)\n' in (project / "train.py").read_text()


def test_a_positional_flag_and_a_negated_test_are_spelled_in_the_callers_terms(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "model_setup.py", "    if fp16:\n", "    if not fp16:\n        pass\n    else:\n")
    _edit(project / "train.py", 'prepare(net, opt, "cuda", fp16=args.fp16, opt_level="O1")', 'prepare(net, opt, "cuda", args.fp16 and args.steps > 0)')
    _fix(project)
    text = (project / "train.py").read_text()
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=(args.fp16 and args.steps > 0))\n' in text
    _compiles_and_is_stable(project)


def test_same_file_helper_also_used_for_evaluation_refuses(tmp_path):
    project = _copy(tmp_path, SAME_FILE)
    _edit(
        project / "train.py",
        "def main():\n",
        "def evaluate(args):\n    model, _ = build_model_and_optimizer(args)\n    return model(torch.randn(2, 8).cuda())\n\n\ndef main():\n",
    )
    reasons = _refused(project)
    assert "`build_model_and_optimizer()` is called 2 times in this file" in reasons["train.py"]


def test_same_file_helper_used_as_a_value_refuses(tmp_path):
    project = _copy(tmp_path, SAME_FILE)
    _edit(project / "train.py", "    args = parse_args()\n", "    args = parse_args()\n    builders = [build_model_and_optimizer]\n")
    reasons = _refused(project)
    assert "`build_model_and_optimizer()` is used otherwise than by calling it" in reasons["train.py"]


def test_same_file_helper_called_from_another_file_too_refuses(tmp_path):
    project = _copy(tmp_path, SAME_FILE)
    (project / "sweep.py").write_text(
        "from apex import amp\nfrom train import build_model_and_optimizer\n\n\n"
        "def sweep(args, batch):\n"
        "    model, optimizer = build_model_and_optimizer(args)\n"
        "    loss = model(batch).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    optimizer.step()\n"
    )
    reasons = _refused(project)
    assert "sets apex up for callers in this file and in others" in reasons["train.py"]


TRAINER = '''import torch
from torch import nn

from apex import amp
from model_setup import prepare


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net, opt = prepare(net, opt, cfg.device, fp16=cfg.fp16)
        self.model = net
        self.optimizer = opt

    def train_step(self, x, y):
        output = self.model(x)
        loss = nn.functional.cross_entropy(output, y)
        self.optimizer.zero_grad()
        if self.cfg.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        else:
            loss.backward()
        self.optimizer.step()
        return loss
'''


def test_a_trainer_class_calling_the_helper_keeps_the_scaler_as_an_attribute(tmp_path):
    """`__init__` calls the helper, `train_step()` scales the loss: `self.scaler`, created after the call."""
    project = _copy(tmp_path)
    (project / "train.py").write_text(TRAINER)
    _fix(project)
    text = (project / "train.py").read_text()
    assert _apex_free(text + (project / "model_setup.py").read_text())
    assert (
        "        net, opt = prepare(net, opt, cfg.device, fp16=cfg.fp16)\n"
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(cfg.fp16))\n'
    ) in text
    assert '        with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n' in text
    assert "            self.scaler.unscale_(self.optimizer)\n" in text
    _compiles_and_is_stable(project)


def test_a_group_reason_names_the_caller_and_its_own_reason(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train.py", 'opt_level="O1")', 'opt_level="O1", loss_scale=8.0)')
    reasons = _refused(project)
    assert "(train.py cannot be migrated with it: `prepare()` is called with `loss_scale=`" in reasons["model_setup.py"]


def test_same_file_helper_reading_the_opt_level_from_its_argument(tmp_path):
    """`amp.initialize(..., opt_level=args.opt_level)` in a helper given `args`: the guard is in
    the helper's own terms, the caller's `enabled=` in its own."""
    project = _copy(tmp_path, SAME_FILE)
    _edit(project / "train.py", 'opt_level="O2")', "opt_level=args.opt_level)")
    _edit(project / "train.py", '    return parser.parse_args()\n', '    parser.add_argument("--opt_level", default="O1")\n    return parser.parse_args()\n')
    _fix(project)
    text = (project / "train.py").read_text()
    assert _apex_free(text) and "amp.initialize" not in text
    assert f'    if args.fp16:\n        if args.opt_level == "O3":\n            {O3_GUARD}\n    return model, optimizer\n' in text
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.opt_level != "O0")\n' in text
    _compiles_and_is_stable(project)


def test_a_helper_assigning_the_opt_level_it_reads_refuses(tmp_path):
    project = _copy(tmp_path, SAME_FILE)
    _edit(project / "train.py", 'opt_level="O2")', "opt_level=args.opt_level)")
    _edit(project / "train.py", "    args.start_epoch = 0\n", '    args.opt_level = "O1"\n')
    reasons = _refused(project)
    assert "assigns `args.opt_level`, which its apex test reads" in reasons["train.py"]


def test_same_file_helper_making_its_own_optimizer_called_for_inference_elsewhere_refuses(tmp_path):
    """The helper builds the optimizer itself: whether a caller trains with it cannot be told."""
    project = _copy(tmp_path, SAME_FILE)
    (project / "predict.py").write_text(
        "import torch\nfrom train import build_model_and_optimizer, parse_args\n\n\n"
        "def predict(x):\n    model, _ = build_model_and_optimizer(parse_args())\n    return model(x)\n"
    )
    reasons = _refused(project)
    assert "`build_model_and_optimizer()` sets apex up for callers in this file and in others" in reasons["train.py"]


def test_a_registration_beside_the_helpers_import_goes_with_its_try(tmp_path):
    """`apex.amp.register_half_function(torch, "einsum")` in the helper's `try` (CUDA autocast
    casts einsum to fp16 by itself): the registration goes with `amp.initialize`, and the `try`
    importing apex for both goes whole."""
    project = _copy(tmp_path)
    _edit(
        project / "model_setup.py",
        "            from apex import amp\n",
        '            import apex\n            from apex import amp\n\n            apex.amp.register_half_function(torch, "einsum")\n',
    )
    assert "CUDA autocast already casts `torch.einsum`" in _messages(project)["model_setup.py"]
    _fix(project)
    a = (project / "model_setup.py").read_text()
    assert "try" not in a and "pass" not in a and _apex_free(a)
    _compiles_and_is_stable(project)


def test_a_test_reading_the_optimizer_that_amp_initialize_rebinds():
    """`if use_amp and optimizer: model, optimizer = amp.initialize(model, optimizer, ...)`: the
    call's own rebinding comes after its test ran, to the same (patched) objects."""
    source = (
        "from apex import amp\n\n\n"
        "def init_amp(model, optimizer=None, use_amp=None):\n"
        "    if use_amp and optimizer:\n"
        "        model, optimizer = amp.initialize(model, optimizer, opt_level=use_amp)\n"
        "    return model, optimizer\n"
    )
    helper, why = helper_of(ast.parse(source), "x.py")
    assert why == "" and helper is not None and helper.optimizer_param == "optimizer"
    rebinding = source.replace("    if use_amp", "    optimizer = optimizer or None\n    if use_amp")
    helper, why = helper_of(ast.parse(rebinding), "x.py")
    assert helper is None and "rebinds its parameter `optimizer`" in why


def test_a_helper_called_by_another_function_of_its_file_names_it(tmp_path):
    """`build()` calls the setup helper and hands its model and optimizer on: not followed, and
    the reason says through which function."""
    project = _copy(tmp_path)
    _edit(project / "model_setup.py", "    return model, optimizer\n", "    return model, optimizer\n\n\ndef build(model, optimizer, fp16):\n    return prepare(model, optimizer, 'cuda', fp16=fp16)\n")
    _edit(project / "train.py", "from model_setup import prepare\n", "from model_setup import build\n")
    _edit(project / "train.py", 'net, opt = prepare(net, opt, "cuda", fp16=args.fp16, opt_level="O1")', "net, opt = build(net, opt, args.fp16)")
    reasons = _refused(project)
    assert "`prepare()` sets apex up and returns the model and optimizer to `build()` in this file, where no loss is scaled" in reasons["model_setup.py"]


INFERENCE_ARM = FIXTURES / "AMP101" / "apex_setup_helper_inference_arm.project"


def test_a_helper_with_an_inference_arm_is_one_setup():
    """DPR's forks: `if optimizer is None: model = amp.initialize(model, optimizer, ...)` else the
    training call. The arm's test is no condition of a training caller's setup."""
    path = str(INFERENCE_ARM / "model_setup.py")
    helper, why = helper_of(ast.parse((INFERENCE_ARM / "model_setup.py").read_text()), path)
    assert why == "" and helper is not None
    assert (helper.init_line, helper.arms_line, helper.optimizer_param) == (16, 13, "optimizer")
    assert [(ast.unparse(t), taken) for t, taken in helper.tests] == [("fp16", True)]


def test_fix_drops_both_arms_and_the_trainer_makes_the_scaler(tmp_path):
    project = _copy(tmp_path, INFERENCE_ARM)
    evaluate = (project / "evaluate.py").read_text()
    output = _fix(project)
    helper = (project / "model_setup.py").read_text()
    trainer = (project / "train.py").read_text()
    assert _apex_free(helper + trainer) and "amp.initialize" not in helper
    assert (
        "    if fp16:\n"
        '        if opt_level == "O3":\n'
        f"            {O3_GUARD}\n"
        "    return model, optimizer\n"
    ) in helper
    assert (
        '        net, opt = prepare(net, opt, "cuda", fp16=fp16)\n'
        '        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))\n'
    ) in trainer
    assert "                self.scaler.step(self.optimizer)\n                self.scaler.update()\n" in trainer
    assert (project / "evaluate.py").read_text() == evaluate  # inference: nothing to change there
    assert "Fixed" in output
    _compiles_and_is_stable(project)


@pytest.mark.parametrize(
    "old, new",
    [
        ("model = amp.initialize(model, optimizer, opt_level=opt_level)", "model = amp.initialize(model, optimizer, opt_level=\"O2\")"),
        ("model = amp.initialize(model, optimizer, opt_level=opt_level)", "net = amp.initialize(model, optimizer, opt_level=opt_level)"),
        ("if optimizer is None:", "if device is None:"),
        ("        else:\n", "        if optimizer is not None:\n"),
    ],
    ids=["other-options", "other-model", "other-test", "not-one-if"],
)
def test_two_calls_that_are_not_one_setup_refuse(tmp_path, old, new):
    project = _copy(tmp_path, INFERENCE_ARM)
    _edit(project / "model_setup.py", old, new)
    reasons = _refused(project)  # each file unchanged, each with a reason
    assert reasons["model_setup.py"] and reasons["train.py"]


def test_the_training_arm_may_come_first(tmp_path):
    project = _copy(tmp_path, INFERENCE_ARM)
    text = (project / "model_setup.py").read_text()
    inference = "            model = amp.initialize(model, optimizer, opt_level=opt_level)\n"
    training = "            model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)\n"
    text = text.replace("if optimizer is None:", "if optimizer is not None:").replace(inference, "@@").replace(training, inference)
    (project / "model_setup.py").write_text(text.replace("@@", training))
    _fix(project)
    assert "amp.initialize" not in (project / "model_setup.py").read_text()
    _compiles_and_is_stable(project)


def test_a_helper_handed_apex_module_refuses(tmp_path):
    """QG-unilm's run_seq2seq.py: `prepare_for_training(..., amp=amp)` tests `if amp:` and loads
    apex's state; the fix once passed `scaler=scaler` before creating it and left `enabled=amp`
    reading the `amp` it removed."""
    text = textwrap.dedent("""
        import torch


        def prepare(args, model, ckpt, amp):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if amp:
                model, optimizer = amp.initialize(model, optimizer, opt_level=args.level)
                if ckpt:
                    amp.load_state_dict(ckpt["amp"])
            return model, optimizer


        def train(args, model, data):
            if args.fp16:
                try:
                    from apex import amp
                except ImportError:
                    raise ImportError("need apex")
            else:
                amp = None
            model, optimizer = prepare(args, model, None, amp=amp)
            for x in data:
                loss = model(x)
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled:
                        scaled.backward()
                else:
                    loss.backward()
                optimizer.step()
    """)
    (tmp_path / "run.py").write_text(text)
    reasons = _refused(tmp_path)
    assert "`prepare()` is handed apex's amp module at line 22" in reasons["run.py"]


MAIN_GUARD = FIXTURES / "AMP101" / "setup_helper_main_guard.project"


def test_a_helper_called_in_a_scripts_main_block_makes_the_scaler_there(tmp_path):
    """UCSNet's `model, optimizer, ... = distribute_model(args)` in `if __name__ == "__main__":`,
    apex set up under a test of a global of the script: the scaler follows the call in the block,
    the test spelled as the block reads it; `main()` reads the global scaler."""
    project = _copy(tmp_path, MAIN_GUARD)
    _fix(project)
    text = (project / "train.py").read_text()
    assert _apex_free(text) and "amp.initialize" not in text
    assert (
        '    model, optimizer, train_loader = distribute_model(args)\n'
        "    scaler = torch.amp.GradScaler(\n"
        '        "cuda",\n'
        '        enabled=is_distributed and args.sync_bn and args.opt_level != "O0",\n'
        "    )\n"
        "    main(args, model, optimizer, train_loader)\n"
    ) in text
    assert '        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n' in text
    _compiles_and_is_stable(project)


def test_a_global_the_caller_shadows_cannot_be_spelled_there(tmp_path):
    project = _copy(tmp_path, MAIN_GUARD)
    _edit(
        project / "train.py",
        'if __name__ == "__main__":\n    model, optimizer, train_loader = distribute_model(args)\n    main(args, model, optimizer, train_loader)\n',
        "def run():\n    is_distributed = False\n    model, optimizer, train_loader = distribute_model(args)\n"
        "    main(args, model, optimizer, train_loader)\n    return is_distributed\n",
    )
    reasons = _refused(project)
    assert "sets apex up under a test (`is_distributed`) that cannot be spelled in its caller's terms" in reasons["train.py"]


def test_a_main_block_calling_the_training_before_the_helper_refuses(tmp_path):
    """The training function would read the global scaler before the block makes it."""
    project = _copy(tmp_path, MAIN_GUARD)
    _edit(
        project / "train.py",
        "    model, optimizer, train_loader = distribute_model(args)\n",
        "    main(args, None, None, [])\n    model, optimizer, train_loader = distribute_model(args)\n",
    )
    reasons = _refused(project)
    assert "cannot be created right after `distribute_model()`: code outside the `if`" in reasons["train.py"]


RETURNING_ARM = FIXTURES / "AMP101" / "apex_setup_helper_returning_arm.project"


def test_an_inference_arm_returning_its_model_keeps_its_return(tmp_path):
    """ujiuji1259/wiki_en's `to_fp16()`: apex spelled out beside `from apex import amp`, the
    inference arm returning the model itself; the training caller is a method calling the helper
    under `if fp16:`, unpacking into `self.model`."""
    project = _copy(tmp_path, RETURNING_ARM)
    _fix(project)
    util = (project / "util.py").read_text()
    assert "    if optimizer is None:\n        return model\n\n    return model, optimizer\n" in util
    assert _apex_free(util) and O3_GUARD in util
    ranker = (project / "ranker.py").read_text()
    assert '        scaler = torch.amp.GradScaler("cuda", enabled=fp16 and fp16_opt_level != "O0")\n        if fp16:\n' in ranker
    assert _apex_free(ranker) and _apex_free((project / "evaluate.py").read_text())
    _compiles_and_is_stable(project)


def test_a_test_read_written_in_the_arm_before_the_helper_refuses(tmp_path):
    project = _copy(tmp_path, RETURNING_ARM)
    _edit(project / "ranker.py", "            assert fp16_opt_level is not None\n", "            fp16_opt_level = fp16_opt_level or \"O1\"\n")
    reasons = _messages(project)
    assert "the GradScaler cannot be created right after `to_fp16()`" in reasons["ranker.py"], reasons
    before = (project / "util.py").read_text()
    _fix(project)
    assert (project / "util.py").read_text() == before  # the group stays on apex
