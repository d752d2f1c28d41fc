"""compile_trigger must find exactly what re.compile finds, where it finds it."""

from __future__ import annotations

import random
import re

import pytest

from ampmigrate.engine.fast_regex import compile_trigger
from ampmigrate.engine.prefilter import _requirements
from ampmigrate.rules import all_rules

from conftest import FIXTURES

RULE_TRIGGERS = [t for rule in all_rules() for t in rule.triggers]
# What the pre-filter asks of a rule besides (its packages, the last parts of its prefixes).
RULE_REQUIREMENTS = sorted({r for rule in all_rules() for r in _requirements(rule)})
PATTERNS = [
    *RULE_TRIGGERS,
    *RULE_REQUIREMENTS,
    # An alternation, a group or a repeat: guarded by a search for the literals a match holds.
    r"\b(?:GradScaler|ShardedGradScaler)\b",
    r"\.\s*(?:div_|mul_)\s*\(|/=|\*=",
    r"\b(?:amp|apex|half)\b",
    r"(?:amp)+x",
    r"(?:amp)*xy",  # taken zero times: only `xy` is needed
    r"(?:amp){0,2}precision",
    r"(?i:amp)|apex",  # case-insensitive: nothing to guard with
    r"(?:ap(?i:ex))|half",
    r"(?:amp|x)|fp16",  # a one-character branch: not guarded
    r"(?:am|ap)ex|half\(",
    r"\b(?:am(?<!\wam)p|apex)\b",
    r"(?=amp)|apex",
    r"(?:a|b|c|d|e|f|g|h|i)mp",
    "|".join(f"(?:{t})" for t in RULE_TRIGGERS),
    r"\bamp\b",
    r"\bhalf\(|\bfp16\b",  # the parser factors the \b out of the alternation
    r"\bamp|\bamp\b",
    r"(?:\bapex\b)|(?:\bamp\b)|(?:GradScaler)|(?:precision\s*=)|(?:\.half\(\))",
    r"\b_private\b",
    r"\b9lives",
    r"\b(?:amp|apex)\b",
    r"\b\.half",  # \b before a non-word character: left alone
    r"\bé\w+",
    r"(?i)\bamp\b",
    r"(?a)\bamp",
    r"x|\bamp",
    r"^\bamp",
    r"\b[ab]mp",
    r"[Nn][Oo][Qq][Aa]\s*:\s*[Aa][Mm][Pp]",  # AMP001's trigger: a lower-case guard first
    r"[Nn]o[Qq]a\b",
    r"[Nn][Oo]",  # too short to guard
    r"[Nn]é[Qq]a",  # a non-ASCII literal: not guarded
]
TEXTS = [
    "",
    "amp",
    " amp ",
    "clamp sample amp_ examples",
    "_amp x.amp amp.autocast(amp)",
    "from torch.cuda import amp\n",
    "a = 1\n9lives _private half( fp16 fp160 xhalf(\n",
    "x.half() precision = 16 precision=16 GradScaler apex",
    "émile élan\n",
    "AMP Amp aMp",
    "ampamp amp\namp",
    "x = 1  # NOQA:AMP101\ny = 2  # nOqA :  aMp\n# noqa: amp\n",
    "# NoQa\u212a: Amp  İNOQA: AMP  ΣNOQAΣ:AMP\n",
    "Noqa NOQA noQa nOQa néqa NéQa\n",
    "x.div_(2) y /= 3 z *= 4 x . mul_ (1)\n",
    "ShardedGradScaler() torch.amp.GradScaler GradScaler_\n",
    "ampampx xy AMPx APEX ApEx apEX amex apex_ half(\n",
]


def _random_texts(count=300, seed=7):
    rng = random.Random(seed)
    alphabet = [
        "amp", "apex", "half", "fp16", "(", ")", " ", "_", "x", "9", ".", "\n", "é", "precision", "=", "AMP", "lives",
        "_private", "b", "ex", "EX", "y", "/", "*", "mul_", "div_", "GradScaler", "Sharded", "Trainer", "lightning",
    ]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(count)]


CORPUS = TEXTS + _random_texts() + [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py"))]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_matches_as_re(pattern):
    plain = re.compile(pattern)
    fast = compile_trigger(pattern)
    for text in CORPUS:
        assert [m.span() for m in fast.finditer(text)] == [m.span() for m in plain.finditer(text)], (pattern, text)
        found, expected = fast.search(text), plain.search(text)
        assert (found and found.span()) == (expected and expected.span()), (pattern, text)


def test_the_common_trigger_shape_is_rewritten():
    # A rewritten pattern is compiled from the parse tree, so it has no source string.
    assert compile_trigger(r"\bamp\b").pattern is None
    assert compile_trigger(r"\bhalf\(|\bfp16\b").pattern is None
    assert compile_trigger(r"\b\.half").pattern == r"\b\.half"  # nothing to gain: left alone


def test_a_pattern_spelling_both_cases_is_guarded_by_a_lower_case_search():
    guarded = compile_trigger(r"[Nn][Oo][Qq][Aa]\s*:\s*[Aa][Mm][Pp]")
    assert type(guarded).__name__ == "_LowerCaseGuard"
    assert guarded.search("x  # no qa: amp") is None
    assert guarded.search("x  # NoQA:AMP1").span() == (5, 13)
    assert type(compile_trigger(r"[Nn][Oo]")).__name__ == "Pattern"


def test_an_alternation_is_guarded_by_the_literals_every_match_holds():
    guarded = compile_trigger(r"\b(?:GradScaler|ShardedGradScaler)\b")
    assert type(guarded).__name__ == "_LiteralGuard"
    assert guarded._needed == ("GradScaler",)  # a text with the longer one has the shorter one
    assert compile_trigger(r"\.\s*(?:div_|mul_)\s*\(|/=|\*=")._needed == ("*=", "/=", "div_", "mul_")
    assert guarded.search("torch.amp.GradScaler()").span() == (10, 20)
    assert guarded.search("GradScalers") is None
    assert compile_trigger(r"(?:amp)*xy")._needed == ("xy",)  # the repeat may be taken no time
    assert compile_trigger(r"\bamp\b")._needed == ("amp",)
    # Nothing certain to search for: no guard.
    for pattern in (r"(?i:amp)|apex", r"(?:amp|x)|fp16", r"[Nn][Oo]", r"\w+"):
        assert type(compile_trigger(pattern)).__name__ == "Pattern", pattern
