"""Import statements as findings of their own: which fix of the uses also changes the statement.

An import line is reported with the fix its uses' rule already makes when that fix removes or
rewrites the statement (the same Fix object, so the engine applies it once); otherwise the finding
says why the line is left alone.
"""

from __future__ import annotations

from typing import Iterable, Optional, Set

import libcst as cst

from ampmigrate.diagnostics import Fix


def inside(ctx, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    return node is statement or any(a is statement for a in ctx.names.ancestors(node))


def covering(ctx, nodes: Iterable[cst.CSTNode]) -> Set[int]:
    """The ids of `nodes` and of all their ancestors: `inside(ctx, node, s)` holds for some node of
    `nodes` exactly when `id(s)` is in it (one pass, not one walk up per node and statement)."""
    found: Set[int] = set()
    for node in nodes:
        if id(node) in found:
            continue  # its ancestors are in already
        found.add(id(node))
        for ancestor in ctx.names.ancestors(node):
            if id(ancestor) in found:
                break  # and the rest of the way up
            found.add(id(ancestor))
    return found


def touches(ctx, fix: Fix, statement: cst.CSTNode) -> bool:
    """Whether the fix replaces or removes the statement, a part of it, or a block holding it."""
    around = {id(statement), *(id(a) for a in ctx.names.ancestors(statement))}
    return any(id(target) in around or inside(ctx, target, statement) for target, _ in fix.changes)


def fix_for(ctx, fixes: Iterable[Optional[Fix]], statement: cst.CSTNode) -> Optional[Fix]:
    return next((fix for fix in fixes if fix is not None and touches(ctx, fix, statement)), None)
