"""Import statements as findings of their own: which fix of the uses also changes the statement.

An import line is reported with the fix its uses' rule already makes when that fix removes or
rewrites the statement (the same Fix object, so the engine applies it once); otherwise the finding
says why the line is left alone.
"""

from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst

from ampmigrate.diagnostics import Fix


def inside(ctx, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    return node is statement or any(a is statement for a in ctx.names.ancestors(node))


def touches(ctx, fix: Fix, statement: cst.CSTNode) -> bool:
    """Whether the fix replaces or removes the statement, a part of it, or a block holding it."""
    around = {id(statement), *(id(a) for a in ctx.names.ancestors(statement))}
    return any(id(target) in around or inside(ctx, target, statement) for target, _ in fix.changes)


def fix_for(ctx, fixes: Iterable[Optional[Fix]], statement: cst.CSTNode) -> Optional[Fix]:
    return next((fix for fix in fixes if fix is not None and touches(ctx, fix, statement)), None)
