"""Every node of an `ast` tree by type, from one walk, kept for the last tree asked.

The pre-filter's screens (engine/prefilter.py) run one after another on the same tree of a file;
each asks for the nodes of a few types (constants, calls, names). One walk serves them all.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Type

_last_tree: Optional[ast.AST] = None
_last_index: Dict[type, List[ast.AST]] = {}


def nodes_of(tree: ast.AST, kind: Type[ast.AST]) -> List[ast.AST]:
    """The nodes of `tree` whose type is exactly `kind`, in `ast.walk` order."""
    global _last_tree, _last_index
    if tree is not _last_tree:
        index: Dict[type, List[ast.AST]] = {}
        for node in walk_order(tree):
            found = index.get(type(node))
            if found is None:
                index[type(node)] = [node]
            else:
                found.append(node)
        _last_tree, _last_index = tree, index
    return _last_index.get(kind, [])


def walk_order(tree: ast.AST) -> List[ast.AST]:
    """`list(ast.walk(tree))`: the same nodes in the same (breadth-first) order, faster (no
    generators per node for its fields and children)."""
    order: List[ast.AST] = [tree]
    append = order.append
    for node in order:  # grows as it goes: each node's children join the end
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        append(item)
    return order
