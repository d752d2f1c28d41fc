"""`check --add-noqa`: a `# noqa: CODES` on the line of every finding (ruff's --add-noqa).

A line that already has a `# noqa: ...` gets the missing codes added to it; a blanket `# noqa`
is left alone. A line whose end is inside a multi-line string, or continued with a backslash,
cannot take a comment: it is skipped with an error naming it. Notebooks are not edited.
"""

from __future__ import annotations

import io
import tokenize
from collections import defaultdict
from typing import Dict, List, Sequence, Set, Tuple

from ampmigrate.diagnostics import FileError, Finding
from ampmigrate.engine.noqa import LINE_NOQA
from ampmigrate.notebook import is_notebook
from ampmigrate.source import SourceError, SourceFile, split_lines, write_atomic


def add_noqa_comments(findings: Sequence[Finding]) -> Tuple[int, List[FileError]]:
    """Edit the files of `findings`; (comments added or extended, errors)."""
    by_file: Dict[str, Dict[int, Set[str]]] = defaultdict(lambda: defaultdict(set))
    for finding in findings:
        by_file[finding.path][finding.noqa_row or finding.location.row].add(finding.code)
    added, errors = 0, []
    for path, rows in sorted(by_file.items()):
        if is_notebook(path):
            errors.append(FileError(path, "--add-noqa does not edit notebooks; add the comments in the cells"))
            continue
        try:
            source = SourceFile.read(path)
            new_text, count, skipped = with_noqa(source.text, rows)
            if count:
                write_atomic(path, source.encode(new_text), source.raw)
        except SourceError as exc:
            errors.append(FileError(path, str(exc)))
            continue
        added += count
        errors.extend(FileError(path, f"line {row}: cannot take a comment (its end is inside a string or continued); no noqa added") for row in skipped)
    return added, errors


def with_noqa(text: str, rows: Dict[int, Set[str]]) -> Tuple[str, int, List[int]]:
    """`text` with the codes of `rows` (1-based row -> codes) in a noqa comment on each row."""
    lines = split_lines(text, keepends=True)
    unsafe = _rows_that_cannot_end_in_a_comment(text)
    count, skipped = 0, []
    for row, codes in sorted(rows.items()):
        if row in unsafe or not 1 <= row <= len(lines):
            skipped.append(row)
            continue
        line = lines[row - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        match = LINE_NOQA.search(_comment_part(body))
        if match is not None:
            if not match.group("codes"):
                continue  # a blanket noqa suppresses everything already
            offset = len(body) - len(_comment_part(body))
            present = [c.strip() for c in match.group("codes").replace(",", " ").split()]
            missing = sorted(codes - {c.upper() for c in present})
            if not missing:
                continue
            end = offset + match.end("codes")
            body = body[:end] + ", " + ", ".join(missing) + body[end:]
        else:
            body = body.rstrip() + "  # noqa: " + ", ".join(sorted(codes))
        lines[row - 1] = body + ending
        count += 1
    return "".join(lines), count, skipped


def _comment_part(line: str) -> str:
    """From the line's first `#` that starts a comment (a cheap scan; strings on one line skipped)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[index:]
    return ""


def _rows_that_cannot_end_in_a_comment(text: str) -> Set[int]:
    rows: Set[int] = set()
    for number, line in enumerate(split_lines(text), start=1):
        if line.rstrip().endswith("\\"):
            rows.add(number)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                rows.update(range(token.start[0], token.end[0]))
            elif getattr(tokenize, "FSTRING_MIDDLE", None) == token.type and token.end[0] > token.start[0]:
                rows.update(range(token.start[0], token.end[0]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return rows
