"""rules/apex/_scalerless_calls.py: which calls of a training function never reach its scaled
backward, read from their literal arguments. The fixtures AMP101/scalerless_mode_calls (a
validation call with `"valid"`: no scaler) and scalerless_unknown_mode (the mode a variable:
refused) show the migration; these tests pin the evaluation of the `if` tests."""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.rules.apex._scalerless_calls import _UNKNOWN, argument_values, evaluate

FUNCTION = cst.parse_module("def run(mode, model, optimizer=None, apex=None, *, tags=('a',)):\n    pass\n").body[0]


def _values(call: str):
    return argument_values(FUNCTION, cst.parse_expression(call))


@pytest.mark.parametrize(
    "test, call, expected",
    [
        ("mode in ['train']", "run('valid', m)", False),
        ("mode in ['train']", "run('train', m)", True),
        ("mode == 'train'", "run(mode='test', model=m)", False),
        ("mode != 'train'", "run('valid', m)", True),
        ("apex", "run('train', m)", False),
        ("apex", "run('train', m, apex=flag)", _UNKNOWN),
        ("not apex", "run('train', m, None, True)", False),
        ("optimizer is None", "run('valid', m)", True),
        ("optimizer is not None and mode == 'train'", "run('valid', m, opt)", False),
        ("mode == 'train' or apex", "run('valid', m)", False),
        ("mode == 'train' or apex", "run(x, m)", _UNKNOWN),
        ("'a' in tags", "run('valid', m)", True),
        ("len(mode) > 3", "run('valid', m)", _UNKNOWN),
    ],
)
def test_tests_evaluate_from_the_literal_arguments(test, call, expected):
    assert evaluate(cst.parse_expression(test), _values(call)) is expected


def test_unpacked_arguments_cannot_be_read():
    assert _values("run(*args)") is None
    assert _values("run('valid', m, **extra)") is None
    assert _values("run('valid', m, unknown=1)") is None


def test_a_call_through_the_instance_gives_no_value_for_self():
    method = cst.parse_module("def apply(self, inputs, target, backward=True, mode=None):\n    pass\n").body[0]
    values = argument_values(method, cst.parse_expression("self.apply(x, y, backward=False)"), method=True)
    assert values is not None and values["backward"] is False and values["mode"] is None and "self" not in values
    assert evaluate(cst.parse_expression("backward"), values) is False
    assert argument_values(method, cst.parse_expression("self.apply(x, y, False, 'train', 1)"), method=True) is None


def _derived(source: str, call: str):
    from ampmigrate.engine.names import NameIndex
    from ampmigrate.rules.apex._scalerless_calls import _derived_locals

    module = cst.parse_module(source)
    names = NameIndex(module)
    function = module.body[0]
    scope = next(s for s in names.scopes if s.node is function)
    values = argument_values(function, cst.parse_expression(call))
    return _derived_locals(scope, values)


def test_a_flag_derived_once_from_parameters_is_read():
    source = "def loop(loop_type, loader):\n    is_train = (loop_type == 'train')\n    if is_train:\n        pass\n"
    assert _derived(source, "loop('val', l)") == {"is_train": False}
    assert _derived(source, "loop('train', l)") == {"is_train": True}


@pytest.mark.parametrize(
    "body",
    [
        "    loop_type = loop_type.lower()\n    is_train = loop_type == 'train'\n",  # the parameter rebound
        "    is_train = loop_type == 'train'\n    is_train = True\n",  # the flag bound twice
        "    is_train = args.mode == 'train'\n",  # not a parameter
        "    if loader:\n        is_train = loop_type == 'train'\n",  # not at the function's top level
    ],
)
def test_a_flag_that_may_not_follow_from_the_call_is_not_read(body):
    source = f"def loop(loop_type, loader):\n{body}    if is_train:\n        pass\n"
    assert "is_train" not in _derived(source, "loop('val', l)")
