"""`Rule.applies_to` lets the engine skip a rule for a file without reading it (a precision
recommendation in a test file, a bf16-only rule under the float16 target). It must agree with the
rule's `check`: wherever it says False, `check` run anyway on the rule's own fixtures reports
nothing; and the fixtures that do report are at paths where it says True."""

import glob
import os

import pytest

from ampmigrate.engine.pipeline import Engine
from ampmigrate.rules import all_rules
from ampmigrate.rules.base import Rule
from tests.conftest import make_settings

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
RULES = [rule for rule in all_rules() if type(rule).applies_to is not Rule.applies_to]
SETTINGS = {"bfloat16": make_settings(), "float16": make_settings({"target-dtype": "float16"})}
PATHS = ("train.py", "test_train.py", "train_test.py", "conftest.py", "tests/test_x.py")


def _sources(code):
    return [p for p in sorted(glob.glob(os.path.join(FIXTURES, code, "*.py"))) if not p.endswith(".expected.py")]


def test_some_rules_declare_applicability():
    assert {"AMP401", "AMP405", "AMP409", "AMP410"} <= {rule.code for rule in RULES}


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_check_reports_nothing_where_the_rule_does_not_apply(rule):
    reported_somewhere = False
    for source in _sources(rule.code):
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
        for dtype, settings in SETTINGS.items():
            engine = Engine(settings)
            mine = [r for r in engine.rules if r.code == rule.code]
            for path in PATHS:
                found = [f for f in engine.check_text(text, path, rules=mine).findings if f.code == rule.code]
                if not rule.applies_to(path, settings):
                    assert found == [], f"{rule.code} reports on {source} at {path} ({dtype}) where it does not apply"
                    assert rule.code not in {r.code for r in engine.rules_for(text, path)}
                reported_somewhere = reported_somewhere or bool(found)
    assert reported_somewhere, f"no fixture of {rule.code} reports: the comparison above proved nothing"
