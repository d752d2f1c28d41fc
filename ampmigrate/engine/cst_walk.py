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
from typing import Callable, Dict, List, Optional, Tuple

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


_Hook = Optional[Callable[..., object]]
_HOOKS: Dict[Tuple[type, type], Tuple[_Hook, _Hook]] = {}


def hooks(visitor_class: type, kind: type) -> Tuple[_Hook, _Hook]:
    """The `visit_<Kind>` and `leave_<Kind>` functions of a visitor class, None for those that
    are LibCST's no-op stubs: `CSTVisitor.on_visit` / `on_leave` find them by name for every
    node (a string built and looked up, a no-op called); this is looked up once per class."""
    found = _HOOKS.get((visitor_class, kind))
    if found is None:
        visit = getattr(visitor_class, f"visit_{kind.__name__}", None)
        leave = getattr(visitor_class, f"leave_{kind.__name__}", None)
        found = _HOOKS[(visitor_class, kind)] = (
            None if getattr(visit, "_is_no_op", False) else visit,
            None if getattr(leave, "_is_no_op", False) else leave,
        )
    return found


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a read-only visitor, without rebuilding the tree."""
    if _has_attribute_hooks(visitor):
        raise TypeError(f"{type(visitor).__name__} has per-attribute hooks; use node.visit()")
    cls = type(visitor)
    own = getattr(visitor, "__dict__", {})  # hooks set on the instance are found by name only
    typed = (
        cls.on_visit is cst.CSTVisitor.on_visit
        and cls.on_leave is cst.CSTVisitor.on_leave
        and not any(name.startswith(("visit_", "leave_")) for name in own)
    )
    _walk(node, visitor, cls, typed)


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, cls: type, typed: bool) -> None:
    """`typed`: the visitor has only typed hooks, called from the per-class table (the same
    calls as CSTVisitor.on_visit / on_leave make, without their per-node name lookups)."""
    if typed:
        visit, leave = hooks(cls, type(node))
        descend = visit is None or visit(visitor, node) is not False
    else:
        descend = visitor.on_visit(node)
    if descend:
        order = _ORDERS.get(type(node))
        if order is None or (order[1] and any(getattr(node, name) is not None for name in order[1])):
            order = _learn(node)
        kinds = _KINDS
        for name in order[0]:  # _children(node), inline: this runs for every node of a file
            value = getattr(node, name)
            kind = kinds.get(type(value))
            if kind is None:
                kind = _kind(type(value))
            if kind == _NODE:
                _walk(value, visitor, cls, typed)
            elif kind == _SEQUENCE:
                for item in value:
                    item_kind = kinds.get(type(item))
                    if item_kind is None:
                        item_kind = _kind(type(item))
                    if item_kind == _NODE:
                        _walk(item, visitor, cls, typed)
    if not typed:
        visitor.on_leave(node)
    elif leave is not None:
        leave(visitor, node)


# What a field's value is, by its type: `isinstance(value, cst.CSTNode)` goes through ABCMeta's
# `__instancecheck__` (Python code) for every field of every node; a dict of types does not.
_OTHER, _NODE, _SEQUENCE = 0, 1, 2
_KINDS: Dict[type, int] = {}


def _kind(kind: type) -> int:
    found = _KINDS[kind] = (
        _NODE if issubclass(kind, cst.CSTNode) else _SEQUENCE if issubclass(kind, (list, tuple)) else _OTHER
    )
    return found


# For walkers of their own (engine/names.py's pass): the same table and its three answers.
KINDS, NODE, SEQUENCE, kind_of = _KINDS, _NODE, _SEQUENCE, _kind


def field_order(node: cst.CSTNode) -> Tuple[str, ...]:
    """The fields of `node` LibCST's visit descends into, in its order (a field's value is a
    node, a sequence of nodes, or neither: `KINDS` / `kind_of` by the value's type)."""
    order = _ORDERS.get(type(node))
    if order is None or (order[1] and any(getattr(node, name) is not None for name in order[1])):
        order = _learn(node)
    return order[0]


def _children(node: cst.CSTNode) -> List[cst.CSTNode]:
    """The child nodes LibCST's visit descends into, in its order."""
    found: List[cst.CSTNode] = []
    kinds = _KINDS
    for name in field_order(node):
        value = getattr(node, name)
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(type(value))
        if kind == _NODE:
            found.append(value)
        elif kind == _SEQUENCE:
            for item in value:
                item_kind = kinds.get(type(item))
                if item_kind is None:
                    item_kind = _kind(type(item))
                if item_kind == _NODE:
                    found.append(item)
    return found


def nodes_of_type(node: cst.CSTNode, kind: type) -> List[cst.CSTNode]:
    """The nodes of exactly type `kind` in the tree under `node` (itself included), found with
    the same field orders as `walk` but without a visitor's calls per node."""
    found: List[cst.CSTNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if type(current) is kind:
            found.append(current)
        stack.extend(_children(current))
    return found
