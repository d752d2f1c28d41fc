"""`fix --diff`: a unified diff that `patch` and `git apply` accept."""

from __future__ import annotations

import difflib

from ampmigrate.source import split_lines

# What diff(1) prints after a line that is the last of a file without a final line break.
NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(path: str, old_text: str, new_text: str) -> str:
    """The changes from `old_text` to `new_text` as a unified diff (Python's line breaks)."""
    lines = []
    for line in difflib.unified_diff(
        split_lines(old_text, keepends=True), split_lines(new_text, keepends=True), fromfile=path, tofile=path
    ):
        if line.endswith(("\n", "\r")):
            lines.append(line)
        else:  # a file's last line, without its line break: mark it, or the next line glues on
            lines.append(line + "\n" + NO_NEWLINE)
    return "".join(lines)
