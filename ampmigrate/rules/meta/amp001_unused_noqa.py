"""AMP001: `# noqa` codes that suppress nothing, or name no ampmigrate rule (like ruff's RUF100).

The rule has no `check` of its own: whether a suppression was used is known only once every
other rule has reported, so the pipeline calls `report_suppressions` after the noqa filtering.
Only `AMP` codes are judged (`# noqa: E501` belongs to other linters), blanket `# noqa` is left
alone, and a known code that is not selected (or switched off for the file) is not "unused".
"""

from __future__ import annotations

import re
from typing import Callable, FrozenSet, List, Set, Tuple

import libcst as cst

from ampmigrate.engine.noqa import LINE_NOQA
from ampmigrate.rules.base import Rule


class UnusedNoqa(Rule):
    code = "AMP001"
    triggers = (r"[Nn][Oo][Qq][Aa]\s*:\s*[Aa][Mm][Pp]",)

    def check(self, ctx) -> None:
        """Nothing here: see `report_suppressions`."""

    def report_suppressions(
        self,
        ctx,
        used: Set[Tuple[int, str]],
        known: FrozenSet[str],
        judged: Callable[[str], bool],
    ) -> None:
        """Report each `# noqa` comment's AMP codes that are unknown, or known, `judged` (selected
        for this file) and not in `used` ((row, code) pairs that suppressed a finding)."""
        for owner, comment, row in _noqa_comments(ctx):
            match = LINE_NOQA.search(comment.value)
            if match is None or not match.group("codes"):
                continue
            codes = [c for c in re.split(r"[,\s]+", match.group("codes")) if c]
            unknown = [c for c in codes if c.upper().startswith("AMP") and c.upper() not in known]
            unused = [
                c for c in codes if c.upper() in known and judged(c.upper()) and (row, c.upper()) not in used
            ]
            if not unknown and not unused:
                continue
            parts = []
            if unknown:
                parts.append(f"unknown rule code{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
            if unused:
                parts.append(f"nothing on this line to suppress for {', '.join(unused)}")
            message = f"Unused `noqa` suppression: {'; '.join(parts)}"
            drop = set(unknown) | set(unused)
            fix = ctx.fix(f"Remove {', '.join(c for c in codes if c in drop)} from the `noqa` comment")
            fix.replace(owner, _without_codes(owner, match, [c for c in codes if c not in drop]))
            ctx.report(comment, message, fix=fix.build())


def _noqa_comments(ctx) -> List[Tuple[cst.CSTNode, cst.Comment, int]]:
    """(the comment's owner, the comment, its row) for `noqa` comments other than
    `# ampmigrate: noqa`; the owner (trailing whitespace or an empty line) is what a fix rewrites."""
    found: List[Tuple[cst.CSTNode, cst.Comment, int]] = []
    # Every node of the two kinds, in the order a visit meets them, from the name pass (a visit
    # of its own cost as much as that pass on a large file).
    for node in ctx.names.nodes_of_type((cst.TrailingWhitespace, cst.EmptyLine)):
        comment = node.comment
        if comment is not None and "noqa" in comment.value.lower():
            if not comment.value.lstrip("# ").lower().startswith("ampmigrate:"):
                found.append((node, comment, ctx.position(comment).start.line))
    return found


def _without_codes(owner: cst.CSTNode, match: "re.Match[str]", keep: List[str]) -> cst.CSTNode:
    """`owner` with its comment's `noqa` listing only `keep` (dropped when nothing is left)."""
    text = owner.comment.value
    if keep:
        value = text[: match.start("codes")] + ", ".join(keep) + text[match.end("codes") :]
        return owner.with_changes(comment=cst.Comment(value))
    rest = (text[: match.start()].rstrip() + " " + text[match.end() :].strip()).strip()
    if rest in ("", "#"):
        return owner.with_changes(comment=None, whitespace=cst.SimpleWhitespace(""))
    return owner.with_changes(comment=cst.Comment(rest if rest.startswith("#") else "# " + rest))
