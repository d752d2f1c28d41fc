"""Suppression comments: `# noqa`, `# noqa: AMP201, AMP202` on a finding's first line, and
`# ampmigrate: noqa` (optionally with codes) on a line of its own anywhere in the file."""

from __future__ import annotations

import re
import tokenize
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterator, Tuple

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
    result = Suppressions(file=file_suppressions(text))
    if "noqa" not in text.lower():
        return result
    for row, comment, _ in _comments(text):
        match = LINE_NOQA.search(comment)
        if match and not comment.lstrip("# ").lower().startswith("ampmigrate:"):
            result.lines[row] = result.lines.get(row, frozenset()) | _codes(match)
    return result
