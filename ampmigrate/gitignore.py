"""`.gitignore` pattern matching (the subset of git's rules that matters for discovering files).

Supported: comments, blank lines, `!` negation, trailing `/` (directories only), leading or inner
`/` (anchored to the .gitignore's directory), `*`, `?`, `[...]`, and `**` (any depth). Later
patterns override earlier ones; patterns of deeper .gitignore files override shallower ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class Pattern:
    regex: "re.Pattern[str]"
    negated: bool
    directory_only: bool
    base: str  # posix path of the directory the pattern is relative to ("" = root)


def _translate(glob: str) -> str:
    """A gitignore glob (already stripped of anchoring) as a regex over a relative posix path."""
    out = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append(r"(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append(r"/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append(r".*")
            i += 2
        elif c == "*":
            out.append(r"[^/]*")
            i += 1
        elif c == "?":
            out.append(r"[^/]")
            i += 1
        elif c == "[":
            end = glob.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = glob[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end + 1
        elif c == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_line(line: str, base: str) -> Optional[Pattern]:
    line = line.rstrip("\n").rstrip("\r")
    if not line.strip() or line.startswith("#"):
        return None
    # Trailing spaces are ignored unless escaped.
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    directory_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _translate(line)
    regex = f"^{body}(?:/.*)?$" if anchored else f"^(?:.*/)?{body}(?:/.*)?$"
    return Pattern(re.compile(regex, re.DOTALL), negated, directory_only, base)


def parse(text: str, base: str) -> List[Pattern]:
    patterns = []
    for line in text.splitlines():
        pattern = parse_line(line, base)
        if pattern is not None:
            patterns.append(pattern)
    return patterns


def is_ignored(patterns: Sequence[Pattern], path: str, is_dir: bool, *, parents_checked: bool = False) -> bool:
    """`path`: posix path relative to the root the patterns' bases are relative to.

    `parents_checked`: every directory above `path` was itself found not ignored (a directory walk
    asks this of each directory before entering it), so a directory-only pattern cannot match a
    file through one of its parents and the per-parent matching, most of a walk's cost, is skipped."""
    ignored = False
    for pattern in patterns:
        if pattern.base:
            prefix = pattern.base + "/"
            if not path.startswith(prefix):
                continue
            relative = path[len(prefix) :]
        else:
            relative = path
        if pattern.directory_only and not is_dir:
            # `build/` still matches files below a directory called build.
            if parents_checked or not any(pattern.regex.match(str(p)) for p in PurePosixPath(relative).parents if str(p) != "."):
                continue
        elif not pattern.regex.match(relative):
            continue
        ignored = not pattern.negated
    return ignored
