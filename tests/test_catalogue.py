"""The catalogue documents behaviour, and this keeps it honest: every example's `after` is what
the engine produces, every `valid` snippet is silent, and rules and entries match one to one."""

from __future__ import annotations

import pytest

from ampmigrate.catalogue import FAMILIES, catalogue_dir, load_catalogue, parse_entry, rule_doc
from ampmigrate.engine.pipeline import Engine
from ampmigrate.rules import rule_classes

from conftest import FIXTURES, make_settings

DOCS = load_catalogue()
EXAMPLES = [(code, i, ex) for code, doc in sorted(DOCS.items()) for i, ex in enumerate(doc.examples)]
VALID = [(code, i, snippet) for code, doc in sorted(DOCS.items()) for i, snippet in enumerate(doc.valid)]


def test_every_rule_has_an_entry_and_every_entry_a_rule():
    implemented = {cls.code for cls in rule_classes()}
    assert implemented == set(DOCS)


def test_codes_are_unique_and_names_kebab_case():
    names = [doc.name for doc in DOCS.values()]
    assert len(set(names)) == len(names)
    for doc in DOCS.values():
        assert doc.name == doc.name.lower() and " " not in doc.name and "_" not in doc.name
        assert doc.family in FAMILIES and doc.code.startswith(doc.family)


def test_every_rule_has_fixtures():
    for code in DOCS:
        cases = list((FIXTURES / code).glob("*.py"))
        assert cases, f"tests/fixtures/{code}/ has no fixture"


@pytest.mark.parametrize("code,index,example", EXAMPLES, ids=[f"{c}-{i}" for c, i, _ in EXAMPLES])
def test_example_after_is_what_fix_produces(code, index, example):
    options = dict(example.settings)
    options.setdefault("select", [code])
    engine = Engine(make_settings(options))
    result = engine.fix_text(example.before, f"{code}_example.py")
    assert not result.errors
    produced = result.new_text if result.new_text is not None else example.before
    assert produced == example.after
    if example.after != example.before:
        # The example shows this rule at work: `before` has a finding of it.
        assert code in {f.code for f in engine.check_text(example.before, "x.py").findings}


@pytest.mark.parametrize("code,index,snippet", VALID, ids=[f"{c}-valid{i}" for c, i, _ in VALID])
def test_valid_snippets_are_silent(code, index, snippet):
    findings = Engine(make_settings({"select": [code]})).check_text(snippet, "valid.py").findings
    assert [f.code for f in findings if f.code == code] == []


def test_fix_safety_matches_catalogue():
    """A rule documented as fix=none never offers a fix; one documented unsafe never a safe one."""
    for code, index, example in EXAMPLES:
        findings = Engine(make_settings({"select": [code], **dict(example.settings)})).check_text(example.before, "x.py").findings
        for finding in findings:
            if finding.code != code or finding.fix is None:
                continue
            assert DOCS[code].fix != "none"
            if DOCS[code].fix == "unsafe":
                assert finding.fix.applicability == "unsafe"


def test_rule_codes_are_the_classes_codes():
    """Settings are validated against rule_codes(), read from the catalogue's file names without
    importing the rules (nor LibCST)."""
    from ampmigrate.rules import rule_codes

    assert set(rule_codes()) == {cls.code for cls in rule_classes()}
    assert all(path.stem == load_catalogue()[path.stem].code for path in catalogue_dir().glob("*.toml"))


def test_one_entry_read_alone_is_the_catalogues():
    # A worker reads only the entries of the rules that report in its files (`rule_doc`).
    docs = load_catalogue()
    for code, doc in docs.items():
        assert rule_doc(code) == doc
        assert parse_entry(catalogue_dir() / f"{code}.toml") == doc
    with pytest.raises(KeyError):
        rule_doc("AMP999")
