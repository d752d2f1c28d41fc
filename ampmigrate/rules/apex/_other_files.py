"""The in-file apex migration of another file of the run, planned from the bytes the project
index read: both ends of a cross-file shape (a star import's provider and its users, a checkpoint
helper and the file handing it apex's amp module) decide alike, whichever file is fixed first."""

from __future__ import annotations

import hashlib
from typing import Optional

import libcst as cst

from ampmigrate.engine.context import FileContext
from ampmigrate.engine.fixer import apply_fixes
from ampmigrate.engine.write_check import why_not_written
from ampmigrate.source import SourceError, SourceFile, read_regular_file


def text_as_indexed(index, path: str) -> Optional[str]:
    """The file's text as the index read it (None: changed since, unreadable)."""
    try:
        raw = read_regular_file(path, None)
    except (SourceError, OSError):
        return None
    if hashlib.blake2b(raw, digest_size=16).hexdigest() != index.digests.get(path):
        return None
    try:
        return SourceFile.from_bytes(path, raw).text
    except SourceError:
        return None


def plan_elsewhere(ctx: FileContext, path: str, text: str) -> Optional[str]:
    """Why the in-file migration leaves some apex amp use of the file at `path` (None: it
    migrates every one, with a fix this run applies)."""
    from ampmigrate.rules.apex._amp_migration import _planner_for

    index = ctx.project_index
    try:
        module = cst.parse_module(text)
        other = FileContext(path, text, module, ctx.settings, index.star_bound(path))
    except (cst.ParserSyntaxError, RecursionError):
        return "it does not parse"
    other.project_index = index
    other.imported_elsewhere = frozenset(index.imported_from(path))
    other.imports_scanned = ctx.imports_scanned
    planner = _planner_for(other)
    if hasattr(planner, "verify"):
        planner.verify = False
    plan = planner.plan()
    if not plan.sites:
        return None
    if plan.fix is None:
        return plan.reason or "no fix"
    if planner.unsafe and not ctx.settings.unsafe_fixes:
        return "its fix is unsafe: " + planner.unsafe[0]
    return fix_problem(other, plan.fix)


def fix_problem(ctx: FileContext, fix) -> Optional[str]:
    """Why the engine would not write the fix planned for another file of a group (engine/write_check.py), or None."""
    problem = why_not_written(apply_fixes(ctx.module, [fix]), ctx.text)
    return f"its migration {problem}" if problem is not None else None


def unmigrated_caller(ctx: FileContext, files, function: str, caller: Optional[str]) -> Optional[str]:
    """Why the first of `files` (other than `caller`, the file being planned) that hands apex's
    amp module to `function()` finds no fix; None when each does."""
    index = ctx.project_index
    for other in files:
        if other == caller:
            continue
        text = text_as_indexed(index, other)
        reason = plan_elsewhere(ctx, other, text) if text is not None else "it could not be read again"
        if reason is not None:
            return f"{index.relative(other)} also hands apex's amp module to `{function}()` and is not migrated ({reason})"
    return None


def group_memo(ctx: FileContext, namespace: str, key, compute) -> Optional[str]:
    """`compute()` once per run for `key`, kept on the run's project index: the files of a group are
    planned from the index's bytes in contexts of their own, so a memo per context would let two
    files handing apex's module to one helper plan each other without end. While it runs, asking
    again answers None: a member planned from here is planned as if the group migrated, and every
    reason any member finds (its own plan included, planned whole by the others' keys) still
    reaches every key, so all migrate or none does."""
    index = ctx.project_index
    memo = index.__dict__.setdefault("_apex_group_memo", {}) if index is not None else ctx.shared(namespace, dict)
    full = (namespace, key)
    if full not in memo:
        memo[full] = None  # being decided
        memo[full] = compute()
    return memo[full]
