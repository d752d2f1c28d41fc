"""Compile trigger regexes so that a leading `\\b` does not make them scan byte by byte.

Python's regex engine skips ahead to candidate positions with a fast string search only when a
pattern starts with a literal (or a set of possible first characters). A pattern that starts
with `\\b`, as `\\bamp\\b` and most triggers do, gets no such help and is about 25 times slower
over a large tree (about a second for torch's 46 MB with the AMP2 triggers alone).

`\\b` right before a word character means exactly "the previous character is not a word
character", so `\\bamp` is rewritten to `amp(?<!\\wamp)`: the same matches, but the pattern now
starts with a literal, all of it (the engine skips ahead by the whole literal, not its first
character, which is 3 times faster for `\\bamp\\b` over a framework tree). The rewrite works on the parsed pattern (also where the parser factored
a `\\b` out of an alternation, `\\bhalf|\\bfp16`), and anything it does not understand is left
as it is. It uses the `re` module's parser and compiler, which are not public API: on any
surprise the pattern is compiled normally.
"""

from __future__ import annotations

import functools
import re
from typing import FrozenSet, List, Optional

try:  # Python 3.11+
    from re import _compiler as _sre_compile
    from re import _constants as _sre_constants
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.9 / 3.10
    import sre_compile as _sre_compile  # type: ignore[no-redef]
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_AT = _sre_constants.AT
_AT_BOUNDARY = _sre_constants.AT_BOUNDARY
_LITERAL = _sre_constants.LITERAL
_BRANCH = _sre_constants.BRANCH
_ASSERT_NOT = _sre_constants.ASSERT_NOT
_IN = _sre_constants.IN
_CATEGORY = _sre_constants.CATEGORY
_CATEGORY_WORD = _sre_constants.CATEGORY_WORD
_SUBPATTERN = _sre_constants.SUBPATTERN
_REPEATS = tuple(
    getattr(_sre_constants, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre_constants, name)
)
# A guard searches for at most this many substrings, each at least this long.
_GUARD_LITERALS = 8
_GUARD_LENGTH = 2


@functools.lru_cache(maxsize=None)
def compile_trigger(pattern: str, flags: int = 0) -> "re.Pattern[str]":
    """`re.compile(pattern, flags)`, with leading word boundaries moved out of the way. Kept
    per pattern (the compiled objects hold no state): every engine of a run, and every worker
    forked after `engine/runner.import_engine`, reuses them."""
    plain = re.compile(pattern, flags)
    if flags & (re.LOCALE | re.IGNORECASE | re.VERBOSE):
        return plain
    try:
        tree = _sre_parse.parse(pattern, flags)
        if tree.state.flags & (re.LOCALE | re.IGNORECASE):
            return plain
        folded = _folded_prefix(list(tree.data))
        if folded is not None:
            return _LowerCaseGuard(plain, folded)  # type: ignore[return-value]
        state = tree.state
        needed = _required_literals(list(tree.data))
        data = _without_leading_boundary(list(tree.data), state, flags)
        if data is not None:
            tree.data = data
            compiled = _sre_compile.compile(tree, flags)
        else:
            data, compiled = list(tree.data), plain
        if needed is not None:
            # A substring search for what every match holds rules most texts out first: faster
            # than the engine's scan, even for a pattern that starts with a literal (`str`'s
            # search is about 1.5 times faster than the engine skipping ahead by its prefix),
            # and much faster for an alternation or a set of first characters.
            return _LiteralGuard(compiled, needed)  # type: ignore[return-value]
        return compiled
    except Exception:  # the private parser changed shape: no harm, just no speed-up
        return plain


def _is_word(code: int, flags: int) -> bool:
    return re.match(r"\w", chr(code), flags & re.ASCII) is not None


def _without_leading_boundary(items: List, state, flags: int) -> Optional[List]:
    """`items` with a leading `\\b` replaced by a look-behind after the first character."""
    if not items:
        return None
    if items[0] == (_AT, _AT_BOUNDARY):
        rest = items[1:]
        first = _starts_with_word_literal(rest, flags)
        if first is not None:
            run = 1
            while run < len(rest) and rest[run][0] is _LITERAL:
                run += 1
            return [*rest[:run], _not_after_word([code for _, code in rest[:run]], state), *rest[run:]]
        if rest and rest[0][0] is _BRANCH:
            _, (marker, alternatives) = rest[0]
            distributed = []
            for alternative in alternatives:
                new = _without_leading_boundary([(_AT, _AT_BOUNDARY), *alternative.data], state, flags)
                if new is None:
                    return None
                distributed.append(_sre_parse.SubPattern(state, new))
            return [*_factor_branch(marker, distributed, state), *rest[1:]]
        return None
    if items[0][0] is _BRANCH:
        _, (marker, alternatives) = items[0]
        changed = False
        rewritten = []
        for alternative in alternatives:
            new = _without_leading_boundary(list(alternative.data), state, flags)
            if new is not None:
                changed = True
                alternative = _sre_parse.SubPattern(state, new)
            rewritten.append(alternative)
        return [*_factor_branch(marker, rewritten, state), *items[1:]] if changed else None
    return None


def _factor_branch(marker, alternatives: List, state) -> List:
    """`a(?<!\\wa)mp|autocast` as `a(?:(?<!\\wa)mp|utocast)`, as the parser itself does with
    common prefixes: a literal prefix lets the engine skip ahead faster than a set of first
    characters does."""
    prefix = []
    datas = [list(alternative.data) for alternative in alternatives]
    while all(datas) and all(data[0] == datas[0][0] for data in datas[1:]):
        prefix.append(datas[0][0])
        datas = [data[1:] for data in datas]
    return [*prefix, (_BRANCH, (marker, [_sre_parse.SubPattern(state, data) for data in datas]))]


def _starts_with_word_literal(items: List, flags: int) -> Optional[int]:
    if items and items[0][0] is _LITERAL and _is_word(items[0][1], flags):
        return items[0][1]
    return None


def _not_after_word(codes: List[int], state):
    """`(?<!\\w<literal>)`, placed right after the literal characters `codes`."""
    body = _sre_parse.SubPattern(state, [(_IN, [(_CATEGORY, _CATEGORY_WORD)]), *((_LITERAL, code) for code in codes)])
    return (_ASSERT_NOT, (-1, body))


# ---------------------------------------------------------------------------------- [Nn][Oo]...
def _folded_prefix(items: List) -> Optional[str]:
    """For a pattern starting with ASCII letters spelled in either case (`[Nn][Oo][Qq][Aa]`,
    which the engine can only scan for character by character), and ASCII literals: that
    start in lower case, if it has at least one such letter and three characters."""
    prefix = []
    either = False
    for op, value in items:
        if op is _LITERAL and value < 128:
            prefix.append(chr(value).lower())
        elif op is _IN and len(value) == 2 and all(kind is _LITERAL for kind, _ in value):
            pair = {chr(code) for _, code in value}
            letter = min(pair).lower()
            if not (letter.isascii() and letter.isalpha() and pair == {letter, letter.upper()}):
                break
            prefix.append(letter)
            either = True
        else:
            break
    return "".join(prefix) if either and len(prefix) >= 3 else None


class _Guard:
    """A compiled pattern that first asks `_may_match(text)`, a fast test that every text with a
    match passes, before the engine scans the text."""

    def __init__(self, compiled: "re.Pattern[str]") -> None:
        self._compiled = compiled

    def _may_match(self, text: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def search(self, text: str, *args):
        if not args and not self._may_match(text):
            return None
        return self._compiled.search(text, *args)

    def finditer(self, text: str, *args):
        if not args and not self._may_match(text):
            return iter(())
        return self._compiled.finditer(text, *args)

    def __getattr__(self, name: str):
        return getattr(self._compiled, name)


class _LowerCaseGuard(_Guard):
    """A compiled pattern that first asks whether the text in lower case holds the start every
    match has, in lower case: one fast substring search instead of the engine's scan. Sound:
    each character of a match's start is ASCII, and `str.lower` maps each character of a text
    on its own, an ASCII one to its lower case."""

    def __init__(self, compiled: "re.Pattern[str]", folded: str) -> None:
        super().__init__(compiled)
        self._folded = folded

    def _may_match(self, text: str) -> bool:
        return self._folded in text.lower()


# ---------------------------------------------------------------------------------- alternations
def _required_literals(items: List) -> Optional[FrozenSet[str]]:
    """Strings one of which every match of the sequence `items` contains (each of at least
    `_GUARD_LENGTH` characters, at most `_GUARD_LITERALS` of them), or None. A run of literal
    characters is contiguous in every match; an alternation (or a group, or a repeat taken at
    least once) contains what each of its branches does. Case-insensitive parts give nothing."""
    best: Optional[FrozenSet[str]] = None

    def consider(candidate: Optional[FrozenSet[str]]) -> None:
        nonlocal best
        if not candidate or len(candidate) > _GUARD_LITERALS or min(map(len, candidate)) < _GUARD_LENGTH:
            return
        if best is None or (min(map(len, candidate)), -len(candidate)) > (min(map(len, best)), -len(best)):
            best = candidate

    run: List[str] = []
    for op, value in items:
        if op is _LITERAL:
            run.append(chr(value))
            continue
        if run:
            consider(frozenset({"".join(run)}))
            run = []
        if op is _BRANCH:
            branches = [_required_literals(list(branch.data)) for branch in value[1]]
            if all(branch is not None for branch in branches):
                consider(frozenset().union(*branches))  # type: ignore[arg-type]
        elif op is _SUBPATTERN:
            _group, add_flags, _del_flags, sub = value
            if not add_flags & (re.IGNORECASE | re.LOCALE):
                consider(_required_literals(list(sub.data)))
        elif op in _REPEATS:
            low, _high, sub = value
            if low >= 1:
                consider(_required_literals(list(sub.data)))
    if run:
        consider(frozenset({"".join(run)}))
    return best


class _LiteralGuard(_Guard):
    """A compiled pattern that first asks whether the text holds one of the strings every match
    contains (`_required_literals`): a few fast substring searches instead of the engine's scan
    for an alternation's first characters."""

    def __init__(self, compiled: "re.Pattern[str]", needed: FrozenSet[str]) -> None:
        super().__init__(compiled)
        # A text holding `ShardedGradScaler` holds `GradScaler`: the shorter one is enough.
        self._needed = tuple(sorted(n for n in needed if not any(o != n and o in n for o in needed)))

    def _may_match(self, text: str) -> bool:
        for literal in self._needed:  # (a loop: a generator costs more than most searches)
            if literal in text:
                return True
        return False

    def search(self, text: str, *args):
        if not args:
            for literal in self._needed:
                if literal in text:
                    break
            else:
                return None
        return self._compiled.search(text, *args)
