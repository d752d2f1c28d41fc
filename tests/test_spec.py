"""The reference migrations of ../shared/spec (copied into tests/fixtures/spec), byte for byte."""

from __future__ import annotations

import filecmp

import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, SHARED_SPEC, make_settings

SPEC = FIXTURES / "spec"

CASES = [
    ("cuda_amp_deprecated.py", "cuda_amp_deprecated.expected.py", {"select": ["AMP2"]}),
    ("fp16_on_ampere.py", "fp16_on_ampere.bf16.expected.py", {"unsafe-fixes": True}),
    ("fp16_on_ampere.py", "fp16_on_ampere.py", {}),  # safe fixes only: unchanged
    # The apex family's fp16 output, switched to bf16 (the end-to-end apex case comes with AMP1).
    ("apex_o1_train.fp16.expected.py", "apex_o1_train.bf16.expected.py", {"unsafe-fixes": True}),
    ("clip_without_unscale.py", "clip_without_unscale.expected.py", {}),
    ("apex_o1_train.py", "apex_o1_train.fp16.expected.py", {}),
    ("apex_o1_train.py", "apex_o1_train.fp16.expected.py", {"select": ["AMP1"]}),
    # apex -> fp16 recipe -> bf16: AMP1 and AMP4 compose through the fix-to-fixed-point loop.
    ("apex_o1_train.py", "apex_o1_train.bf16.expected.py", {"unsafe-fixes": True}),
]


@pytest.mark.parametrize("source,expected,options", CASES, ids=[f"{c[0]}->{c[1]}" for c in CASES])
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


def test_fp16_on_ampere_offers_the_bf16_switch_as_an_unsafe_fix():
    text = (SPEC / "fp16_on_ampere.py").read_bytes().decode("utf-8")
    findings = Engine(make_settings()).check_text(text, "fp16_on_ampere.py").findings
    assert [(f.code, f.location.row) for f in findings] == [("AMP401", 8)]
    assert findings[0].fix is not None and findings[0].fix.applicability == "unsafe"
