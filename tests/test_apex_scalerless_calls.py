"""rules/apex/_scalerless_calls.py: which calls of a training function never reach its scaled
backward, read from their literal arguments. The fixtures AMP101/scalerless_mode_calls (a
validation call with `"valid"`: no scaler) and scalerless_unknown_mode (the mode a variable:
refused) show the migration; these tests pin the evaluation of the `if` tests."""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.rules.apex._scalerless_calls import _UNKNOWN, _argument_values, _evaluate

FUNCTION = cst.parse_module("def run(mode, model, optimizer=None, apex=None, *, tags=('a',)):\n    pass\n").body[0]


def _values(call: str):
    return _argument_values(FUNCTION, cst.parse_expression(call))


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
    assert _evaluate(cst.parse_expression(test), _values(call)) is expected


def test_unpacked_arguments_cannot_be_read():
    assert _values("run(*args)") is None
    assert _values("run('valid', m, **extra)") is None
    assert _values("run('valid', m, unknown=1)") is None
