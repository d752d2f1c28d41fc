"""The reference migrations of ../shared/spec (copied into tests/fixtures/spec), byte for byte."""

from __future__ import annotations

import filecmp

import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, SHARED_SPEC, make_settings

SPEC = FIXTURES / "spec"

CASES = [
    ("cuda_amp_deprecated.py", "cuda_amp_deprecated.expected.py", {"select": ["AMP2"]}),
    ("apex_o1_train.py", "apex_o1_train.fp16.expected.py", {}),
    ("apex_o1_train.py", "apex_o1_train.fp16.expected.py", {"select": ["AMP1"]}),
]


@pytest.mark.parametrize("source,expected,options", CASES, ids=[c[1] for c in CASES])
def test_reference_migration(source, expected, options):
    text = (SPEC / source).read_bytes().decode("utf-8")
    engine = Engine(make_settings(options))
    result = engine.fix_text(text, source)
    assert not result.errors
    produced = result.new_text if result.new_text is not None else text
    assert produced == (SPEC / expected).read_bytes().decode("utf-8")
    assert engine.fix_text(produced, source).new_text is None  # idempotent


@pytest.mark.skipif(not SHARED_SPEC.is_dir(), reason="../shared/spec is not beside this checkout")
def test_copies_match_shared_spec():
    for path in SHARED_SPEC.glob("*.py"):
        assert filecmp.cmp(path, SPEC / path.name, shallow=False), f"{path.name} drifted from ../shared/spec"
