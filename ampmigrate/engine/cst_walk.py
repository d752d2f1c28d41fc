"""Visit a CST with a read-only visitor, without LibCST's cost of rebuilding every node.

`node.visit(visitor)` runs each node's `_visit_and_replace_children`, which builds (and
validates) a new copy of every node even for a `CSTVisitor` that changes nothing, and calls
per-attribute hooks through string lookups. On a large file that costs more than parsing it.
`walk(node, visitor)` makes the same `on_visit` / `on_leave` calls, for the same nodes, in the
same order (a test compares the two event by event), reading the children straight from the
node's fields.

The order of a class's child fields is learned once, from LibCST itself: the class's
`_visit_and_replace_children` is run with a recorder that notes the attributes it visits and
descends nowhere. A field LibCST visits only when it is set (an f-string's `format_spec`) is
learned when the first node that sets it is met.

Only for visitors without per-attribute hooks (`visit_<Node>_<attribute>`); `walk` refuses
others.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import libcst as cst

_Order = Tuple[Tuple[str, ...], Tuple[str, ...]]  # (visited fields in order, fields to watch)
_ORDERS: Dict[type, _Order] = {}


class _FieldRecorder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.fields: List[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.fields.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def _learn(node: cst.CSTNode) -> _Order:
    recorder = _FieldRecorder()
    node._visit_and_replace_children(recorder)
    visited = tuple(dict.fromkeys(recorder.fields))
    known = _ORDERS.get(type(node))
    if known is None:
        # Fields unset here and not visited may be visited on another node of the class.
        watch = tuple(
            f.name for f in dataclasses.fields(node) if f.name not in visited and getattr(node, f.name) is None
        )
    else:
        # Watched fields set on this node are settled now: visited, or never a child.
        watch = tuple(name for name in known[1] if getattr(node, name) is None)
        if len(known[0]) > len(visited):
            visited = known[0]
    order = _ORDERS[type(node)] = (visited, watch)
    return order


def _has_attribute_hooks(visitor: cst.CSTVisitor) -> bool:
    """Whether the visitor overrides a `visit_<Node>_<attribute>` / `leave_...` hook (only the
    classes between it and CSTVisitor are looked at: visitors are often defined per call)."""
    for cls in type(visitor).__mro__:
        if cls is cst.CSTVisitor:
            break
        for name in vars(cls):
            parts = name.split("_", 2)
            if len(parts) == 3 and parts[0] in ("visit", "leave") and isinstance(getattr(cst, parts[1], None), type):
                return True
    return False


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a read-only visitor, without rebuilding the tree."""
    if _has_attribute_hooks(visitor):
        raise TypeError(f"{type(visitor).__name__} has per-attribute hooks; use node.visit()")
    _walk(node, visitor)


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        order = _ORDERS.get(type(node))
        if order is None:
            order = _learn(node)
        if order[1] and any(getattr(node, name) is not None for name in order[1]):
            order = _learn(node)
        for name in order[0]:
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                _walk(value, visitor)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, cst.CSTNode):
                        _walk(item, visitor)
    visitor.on_leave(node)


def nodes_of_type(node: cst.CSTNode, kind: type) -> List[cst.CSTNode]:
    """The nodes of exactly type `kind` in the tree under `node` (itself included), found with
    the same field orders as `walk` but without a visitor's calls per node."""
    found: List[cst.CSTNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if type(current) is kind:
            found.append(current)
        order = _ORDERS.get(type(current))
        if order is None or (order[1] and any(getattr(current, name) is not None for name in order[1])):
            order = _learn(current)
        for name in order[0]:
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(item for item in value if isinstance(item, cst.CSTNode))
    return found
