"""Every node of an `ast` tree by type, from one walk, kept for the last tree asked.

The pre-filter's screens (engine/prefilter.py) run one after another on the same tree of a file;
each asks for the nodes of a few types (constants, calls, names). One walk serves them all.
"""

from __future__ import annotations

import ast
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

_last_tree: Optional[ast.AST] = None
_last_index: Dict[type, List[ast.AST]] = {}
_memo_tree: Optional[ast.AST] = None
_memo: Dict[str, Any] = {}


def memo(tree: ast.AST, key: str, compute: Callable[[ast.AST], Any]) -> Any:
    """`compute(tree)`, kept with the last tree asked (several screens share one answer)."""
    global _memo_tree
    if tree is not _memo_tree:
        _memo.clear()
        _memo_tree = tree
    if key not in _memo:
        _memo[key] = compute(tree)
    return _memo[key]


def release() -> None:
    """Forget the last tree: the pre-filter calls it before the garbage collector runs again,
    so that the tree is freed by reference counting, not walked by a collection first."""
    global _last_tree, _last_index, _memo_tree
    _last_tree, _last_index, _memo_tree = None, {}, None
    _memo.clear()


def nodes_of(tree: ast.AST, kind: Type[ast.AST]) -> List[ast.AST]:
    """The nodes of `tree` whose type is exactly `kind`, in `ast.walk` order (not for the
    contexts and operators, `ast.Load` or `ast.Add`, which are not indexed: `_UNINDEXED`)."""
    global _last_tree, _last_index
    if tree is not _last_tree:
        index: Dict[type, List[ast.AST]] = {}
        for node in _indexed_order(tree):
            found = index.get(type(node))
            if found is None:
                index[type(node)] = [node]
            else:
                found.append(node)
        _last_tree, _last_index = tree, index
    assert kind not in _UNINDEXED_KINDS, kind
    return _last_index.get(kind, [])


# Fields that never lead to a node a screen asks for: names and numbers, and the leaf nodes of
# contexts (`ctx`) and operators (`op`, `ops`). A third of a tree's nodes are such leaves.
_UNINDEXED = frozenset(
    {"ctx", "op", "ops", "id", "attr", "arg", "name", "module", "level", "kind", "type_comment", "is_async", "conversion"}
)
_UNINDEXED_KINDS = frozenset(
    kind for base in (ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop) for kind in base.__subclasses__()
)
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {ast.Constant: ()}


def _indexed_order(tree: ast.AST) -> List[ast.AST]:
    """`walk_order(tree)` without the context and operator leaves (the others in the same order)."""
    order: List[ast.AST] = [tree]
    append = order.append
    fields_of = _CHILD_FIELDS
    for node in order:
        kind = type(node)
        fields = fields_of.get(kind)
        if fields is None:
            fields = fields_of[kind] = tuple(f for f in kind._fields if f not in _UNINDEXED)
        for name in fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        append(item)
            elif isinstance(value, ast.AST):
                append(value)
    return order


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
