"""Suppression comments: `# noqa`, `# noqa: AMP201, AMP202` on a finding's first line, and
`# ampmigrate: noqa` (optionally with codes) on a line of its own anywhere in the file."""

from __future__ import annotations

import bisect
import re
import tokenize
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterator, List, Tuple

from ampmigrate.source import split_lines

_CODES = r"(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[,\s]+[A-Za-z]+[0-9]+)*))?"
LINE_NOQA = re.compile(r"#\s*(?i:noqa)" + _CODES)
_FILE = re.compile(r"^#\s*ampmigrate:\s*(?i:noqa)" + _CODES + r"\s*$")
ALL: FrozenSet[str] = frozenset({"*"})


@dataclass
class Suppressions:
    lines: Dict[int, FrozenSet[str]] = field(default_factory=dict)
    file: FrozenSet[str] = frozenset()

    def suppresses(self, code: str, row: int) -> bool:
        return _matches(self.file, code) or _matches(self.lines.get(row, frozenset()), code)

    def line_suppresses(self, code: str, row: int) -> bool:
        """Whether the `# noqa` on `row` (not a file-level one) names `code` or is blanket."""
        return _matches(self.lines.get(row, frozenset()), code)

    def file_suppresses(self, code: str) -> bool:
        return _matches(self.file, code)


def _matches(codes: FrozenSet[str], code: str) -> bool:
    return "*" in codes or code in codes


def _codes(match: "re.Match[str]") -> FrozenSet[str]:
    raw = match.group("codes")
    if not raw:
        return ALL
    return frozenset(part.upper() for part in re.split(r"[,\s]+", raw) if part)


def _comments(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(row, comment, alone on its line) for every comment; by regex if tokenize gives up."""
    try:
        lines = iter(split_lines(text, keepends=True))
        for token in tokenize.generate_tokens(lambda: next(lines, "")):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string, not token.line[: token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):
        for row, line in enumerate(split_lines(text), start=1):
            index = line.find("#")
            if index >= 0:
                yield row, line[index:], not line[:index].strip()


# Comments and string literals of a text Python accepts, in the order tokenize meets them: a `#`
# inside a string is no comment. Prefixes (`rb`, `f`) need no pattern: a string's extent does
# not depend on them (a raw string's `\'` does not end it either), and 3.11's f-strings are one
# string token. A quote no string pattern closes (not Python; tokenize is asked then).
_SCAN = re.compile(
    "|".join(
        (
            r"(?P<comment>#[^\r\n]*)",
            r"'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''",
            r'"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""',
            r"'[^'\\\r\n]*(?:\\(?:\r\n|[\s\S])[^'\\\r\n]*)*'",
            r'"[^"\\\r\n]*(?:\\(?:\r\n|[\s\S])[^"\\\r\n]*)*"',
            r"(?P<open>['\"])",
        )
    )
)
_NEWLINE = re.compile(r"\r\n?|\n")


def _scanned_comments(text: str, spelling: str = "noqa") -> Iterator[Tuple[int, str]]:
    """(row, comment) for the comments that spell `spelling` (lower case) in any case, for a
    text Python's parser accepts: one regex scan, where tokenize (pure Python on 3.11) costs a
    sixth of a large file's LibCST parse. The same comments and rows as `_comments`
    (tests/test_noqa_scan.py compares them over real trees)."""
    found: List[Tuple[int, str]] = []
    for match in _SCAN.finditer(text):
        comment = match.group("comment")
        if comment is not None:
            if spelling in comment.lower():
                found.append((match.start(), comment))
        elif match.group("open") is not None:  # not Python: as tokenize reads it
            yield from ((row, comment) for row, comment, _ in _comments(text) if spelling in comment.lower())
            return
    if not found:
        return
    starts = [0]
    starts.extend(match.end() for match in _NEWLINE.finditer(text))
    for offset, comment in found:
        yield bisect.bisect_right(starts, offset), comment


def file_suppressions(text: str) -> FrozenSet[str]:
    """Codes a file-level `# ampmigrate: noqa` comment switches off (cheap when there is none)."""
    if "ampmigrate:" not in text:
        return frozenset()
    codes: FrozenSet[str] = frozenset()
    for _, comment, alone in _comments(text):
        match = _FILE.match(comment.strip())
        if alone and match:
            codes |= _codes(match)
    return codes


def parse_suppressions(text: str) -> Suppressions:
    """The suppressions of a text Python's parser accepts (the pipeline asks once the file is
    parsed; for other text the scan falls back to tokenize where a string does not close)."""
    result = Suppressions(file=file_suppressions(text))
    if "noqa" not in text.lower():
        return result
    for row, comment in _scanned_comments(text):
        match = LINE_NOQA.search(comment)
        if match and not comment.lstrip("# ").lower().startswith("ampmigrate:"):
            result.lines[row] = result.lines.get(row, frozenset()) | _codes(match)
    return result
