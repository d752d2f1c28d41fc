"""timm's ApexScaler beside `amp.initialize` (rules/apex/_timm_scaler.py): the shapes beyond the
golden fixtures (tests/fixtures/AMP101/timm_scaler_*)."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, check, fix

from ampmigrate.diagnostics import SAFE, UNSAFE

BASIC = (FIXTURES / "AMP101" / "timm_scaler_basic.py").read_text(encoding="utf-8")


def _initialize(code: str):
    return next(f for f in check(code, select=["AMP1"]) if f.code == "AMP101" and "initialize" in f.message)


def test_basic_is_safe_and_a_second_fix_changes_nothing():
    finding = _initialize(BASIC)
    assert finding.fix is not None and finding.fix.applicability == SAFE
    once = fix(BASIC, select=["AMP1"])
    compile(once, "once.py", "exec")
    assert "amp.initialize" not in once and "ApexScaler" not in once and "from apex import amp" not in once
    assert 'amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)' in once
    assert fix(once, select=["AMP1"]) == once


def test_scaler_of_timm_utils_cuda_and_an_alias():
    code = BASIC.replace(
        "from timm.utils import ApexScaler, NativeScaler",
        "from timm.utils.cuda import ApexScaler as AS, NativeScaler",
    ).replace("loss_scaler = ApexScaler()", "loss_scaler = AS()")
    once = fix(code, select=["AMP1"])
    assert "from timm.utils.cuda import NativeScaler\n" in once
    assert "loss_scaler = NativeScaler()" in once


def test_native_scaler_imported_under_the_same_module():
    code = BASIC.replace("from timm.utils import ApexScaler, NativeScaler", "import timm.utils").replace(
        "ApexScaler()", "timm.utils.ApexScaler()"
    ).replace("NativeScaler()", "timm.utils.NativeScaler()")
    once = fix(code, select=["AMP1"])
    assert once.count("loss_scaler = timm.utils.NativeScaler()") == 2


def test_an_existing_partial_import_is_used():
    code = BASIC.replace("from contextlib import suppress", "from contextlib import suppress\nfrom functools import partial")
    once = fix(code, select=["AMP1"])
    assert 'amp_autocast = partial(torch.autocast, "cuda", dtype=torch.float16)' in once
    assert "import functools" not in once


@pytest.mark.parametrize(
    "change, reason",
    [
        (("clip_grad=args.clip_grad, parameters=model.parameters()", "clip_grad=args.clip_grad"), "asserts it is given"),
        (("loss_scaler(loss, optimizer, clip_grad", "loss_scaler(loss, optimizer, args.clip_grad, 'norm', model.parameters(), clip"), "by position"),
        (("amp_autocast=amp_autocast, loss_scaler=loss_scaler)", "amp_autocast=amp_autocast, loss_scaler=loss_scaler)\n        log_scaler(loss_scaler)"), "cannot follow"),
        (("with amp_autocast():\n            output", "with amp_autocast(True):\n            output"), "cannot be found"),
        (('opt_level="O1")', 'opt_level="O1", num_losses=2)'), "num_losses"),
        (('opt_level="O1")', 'opt_level="O1", loss_scale=128.0)'), "loss_scale=128.0"),
        (('opt_level="O1")', 'opt_level="O1", loss_scale="dynamic", enabled=args.amp)'), "enabled"),
        (("        loss_scaler = ApexScaler()\n", "        loss_scaler = ApexScaler()\n        second = ApexScaler()\n"), "more than once"),
    ],
)
def test_refusals(change, reason):
    old, new = change
    assert old in BASIC
    finding = _initialize(BASIC.replace(old, new))
    assert finding.fix is None
    assert reason in finding.no_fix_reason


def test_clip_of_other_parameters_is_unsafe():
    code = BASIC.replace("parameters=model.parameters()", "parameters=model.head.parameters() if args.head_only else model.parameters()")
    finding = _initialize(code)
    assert finding.fix is not None and finding.fix.applicability == UNSAFE
    assert "amp.master_params" in finding.fix.message


def test_no_clip_needs_no_parameters():
    code = BASIC.replace("clip_grad=args.clip_grad, parameters=model.parameters()", "clip_grad=None")
    finding = _initialize(code)
    assert finding.fix is not None and finding.fix.applicability == SAFE
    assert "clip at line" not in finding.fix.message


def test_without_a_scaler_call_the_old_reason_stays():
    code = BASIC.replace(
        "            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters())\n",
        "            pass\n",
    )
    finding = _initialize(code)
    assert finding.fix is None and "never called" in finding.no_fix_reason


def test_a_star_import_of_another_module_may_bind_functools():
    code = BASIC.replace("from contextlib import suppress", "from contextlib import suppress\nfrom models import *")
    finding = _initialize(code)
    assert finding.fix is None and "may bind `functools`" in finding.no_fix_reason
    spelled = code.replace("from models import *", "from models import *\nimport functools")
    once = fix(spelled, select=["AMP1"])
    assert once.count("import functools") == 1 and "functools.partial(torch.autocast" in once


def test_a_class_of_the_repository_called_apex_scaler_is_not_timms():
    code = (FIXTURES / "AMP101" / "timm_scaler_local_class.py").read_text(encoding="utf-8")
    finding = _initialize(code)
    assert finding.fix is None and "a class of this file, not timm's" in finding.no_fix_reason
    imported = BASIC.replace("from timm.utils import ApexScaler, NativeScaler", "from utils import ApexScaler, NativeScaler")
    finding = _initialize(imported)
    assert finding.fix is None and "`utils.ApexScaler`, not timm's" in finding.no_fix_reason


def test_the_scaler_called_in_a_helper_nested_in_the_training_function():
    """timm's train.py of 2023 calls the scaler in a `_backward(_loss)` closure of train_one_epoch."""
    old = "            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters())\n"
    new = (
        "            def _backward(_loss):\n"
        "                loss_scaler(_loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters())\n\n"
        "            _backward(loss)\n"
    )
    assert old in BASIC
    finding = _initialize(BASIC.replace(old, new))
    assert finding.fix is not None and finding.fix.applicability == SAFE


# ---------------------------------------------------------------------- AGC: the apex arm's guard
AGC = (FIXTURES / "AMP101" / "timm_scaler_agc_guard.py").read_text(encoding="utf-8")
GUARD = 'if cfg.clip_grad is not None and ("agc" in cfg.clip_mode):'


def test_agc_exclusion_gets_a_guard_in_the_apex_arm_and_the_fix_is_safe():
    finding = _initialize(AGC)
    assert finding.fix is not None and finding.fix.applicability == SAFE, finding.fix
    assert "raises ValueError for that configuration" in finding.fix.message
    once = fix(AGC, select=["AMP1"])
    compile(once, "once.py", "exec")
    assert once.index(GUARD) > once.index("scaler = NativeScaler()") and once.count("raise ValueError(") == 1
    assert fix(once, select=["AMP1"]) == once


@pytest.mark.parametrize(
    "change",
    [
        # called twice: which settings reach the clip is not one value
        ("    one_epoch(net, batches, opt, cfg,", "    one_epoch(net, batches[:1], opt, cfg.warmup, autocast=autocast, scaler=scaler)\n    one_epoch(net, batches, opt, cfg,"),
        # the setting read by the clip is written in the file
        ("    for images, labels in batches:", "    cfg.clip_mode = cfg.clip_mode.lower()\n    for images, labels in batches:"),
        # the epoch function is given another name than the arm's `cfg`
        ("    one_epoch(net, batches, opt, cfg,", "    one_epoch(net, batches, opt, cfg.train,"),
        # the expression reads a name that is not a parameter of the epoch function
        ('exclude_head="agc" in cfg.clip_mode', 'exclude_head="agc" in CLIP_MODE'),
    ],
)
def test_agc_exclusion_without_a_readable_guard_stays_unsafe(change):
    code = AGC.replace(*change)
    assert code != AGC
    finding = _initialize(code)
    assert finding.fix is not None and finding.fix.applicability == UNSAFE
    assert "NativeScaler leaves the head's weight and bias unclipped" in finding.fix.message


def test_agc_exclusion_in_the_arms_own_function():
    code = (
        "import torch\n"
        "from apex import amp\n"
        "from contextlib import nullcontext\n"
        "from timm.models import model_parameters\n"
        "from timm.utils import ApexScaler, NativeScaler\n\n\n"
        "def run(cfg, net, batches):\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    autocast = nullcontext\n"
        "    if cfg.apex:\n"
        '        net, opt = amp.initialize(net, opt, opt_level="O1")\n'
        "        scaler = ApexScaler()\n"
        "    else:\n"
        "        autocast = torch.cuda.amp.autocast\n"
        "        scaler = NativeScaler()\n"
        "    for images, labels in batches:\n"
        "        with autocast():\n"
        "            loss = net(images, labels)\n"
        "        opt.zero_grad()\n"
        '        scaler(loss, opt, clip_grad=cfg.clip, clip_mode="agc", parameters=model_parameters(net, exclude_head=cfg.agc))\n'
    )
    once = fix(code, select=["AMP1"])
    assert "        if cfg.clip is not None and (cfg.agc):\n            raise ValueError(" in once, once
