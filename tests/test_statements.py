"""analysis/statements.py `is_pure`: what a migration may evaluate again (a scaler's `enabled=`, a
step's guard) without changing what the program does; `condition_code`: a branch as that test."""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.analysis.statements import is_pure


@pytest.mark.parametrize(
    "code",
    [
        "args.fp16",
        'cfg["train"]["use_fp16"]',
        'self.config.train.get("use_fp16")',  # CreamFL: a config lookup, as a subscript
        'cfg.get("amp", False) and not args.cpu',
        'args.opt_level in ("O1", "O2")',
        "torch.cuda.is_available() and args.amp",  # a query of the machine (SSD-pytorch's setup)
        "torch.distributed.is_initialized()",
        'self.optimizer_type.lower() == "adam"',  # elsa_chatbot: a string's own query
        'args.opt_level.startswith("O")',
    ],
)
def test_pure(code):
    assert is_pure(cst.parse_expression(code))


@pytest.mark.parametrize(
    "code",
    [
        "queue.get(True)",  # Queue.get(block=True): takes an item
        "queue.get()",
        'cfg.get(next(keys))',
        'cfg.get("amp", make_default())',
        'load().get("fp16")',
        "torch.cuda.synchronize()",
        "torch.cuda.set_device(0)",
        "torch.cuda.device_count(load())",
        "th.cuda.is_available()",  # an alias of torch is not followed
        "load().lower()",  # the receiver is a call
        "name.startswith(prefix())",
        "args.mode.strip(chars=' ')",
    ],
)
def test_not_pure(code):
    assert not is_pure(cst.parse_expression(code))


@pytest.mark.parametrize(
    "test, expected",
    [
        ("not args.fp16", "bool(args.fp16)"),  # the `else` of `if not x:` is x, as a bool
        ("not (a or b)", "bool(a or b)"),
        ("not mode == 'train'", "mode == 'train'"),
        ("args.fp16", "not args.fp16"),
        ("a and b", "not (a and b)"),
    ],
)
def test_condition_code_of_an_else_arm(test, expected):
    from ampmigrate.analysis.statements import Branch, condition_code

    module = cst.parse_module(f"if {test}:\n    pass\nelse:\n    pass\n")
    statement = module.body[0]
    assert condition_code(module, [Branch(statement.test, False, statement)]) == expected
