"""Scalers that a plain name or `self.<attr>` binding does not show (scalers.py asks here).

- tuple assignments: `self.model, self.scaler = model, GradScaler()` (the element at the
  target's position);
- dict entries: `scalers = {"gen": GradScaler(), ...}` used as `scalers["gen"].scale(loss)`
  (a constant key, the dict bound once);
- class-level fields (dataclasses, attrs-like classes): `scaler: GradScaler = field(default_factory=
  GradScaler)` used as `self.scaler` in its methods or `state.scaler` on an instance the file makes
  or annotates.

Each is keyed so that every reference to the same storage is one scaler (scalers._key).
"""

from __future__ import annotations

import weakref
from typing import Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampmigrate.api import ANY_GRAD_SCALER
from ampmigrate.engine.names import EMPTY, Binding, NameIndex, Scope

CONTAINER_KEYS = frozenset({"item", "field"})


def storage_bindings(names: NameIndex, node: cst.BaseExpression) -> Optional[List[Binding]]:
    """The bindings of a name, or of `self.<attr>` in a method; None for any other expression."""
    if isinstance(node, cst.Name):
        return names.bindings_of(node)
    if isinstance(node, cst.Attribute):
        return names.self_attribute_bindings(node)
    return None


# ------------------------------------------------------------------------------ tuple assignments
def unpacked_value(names: NameIndex, binding: Binding) -> Optional[cst.BaseExpression]:
    """For `a, b = x, y`: the element of the value that `binding`'s target receives."""
    statement = binding.statement
    if binding.kind != "assign" or not isinstance(statement, cst.Assign):
        return None
    for target in statement.targets:
        elements = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else None
        value = statement.value
        if elements is None or not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) != len(elements):
            continue
        if any(isinstance(e, cst.StarredElement) for e in (*elements, *value.elements)):
            continue
        for element, element_value in zip(elements, value.elements):
            if element.value is binding.node:
                return element_value.value
    return None


def tuple_self_attribute(names: NameIndex, node: cst.Attribute) -> Optional[Tuple[Scope, cst.BaseExpression]]:
    """`self.scaler` bound only by `self.model, self.scaler = model, GradScaler()` (the name pass
    records `self.<attr>` bindings of simple assignments only): the class scope and the value."""
    if not isinstance(node.value, cst.Name) or names.self_attribute_bindings(node):
        return None
    scope = names.method_class_scope(node.value)
    if scope is None:
        return None
    values = [
        value
        for target, value in _tuple_attribute_targets(names).get(node.attr.value, ())
        if names.method_class_scope(target.value) is scope
    ]
    return (scope, values[0]) if len(values) == 1 else None


_TUPLE_TARGETS: "weakref.WeakKeyDictionary[NameIndex, Dict[str, List[Tuple[cst.Attribute, cst.BaseExpression]]]]" = (
    weakref.WeakKeyDictionary()
)


def _tuple_attribute_targets(names: NameIndex) -> Dict[str, List[Tuple[cst.Attribute, cst.BaseExpression]]]:
    """attr -> every (`<name>.attr` target, its value) of the file's tuple assignments
    `a.x, b.y = u, v`; found once per file (asked for every `self.<attr>` of the file)."""
    found = _TUPLE_TARGETS.get(names)
    if found is None:
        found = _TUPLE_TARGETS[names] = {}
        for statement in names.nodes_of_type(cst.Assign):
            value = statement.value
            if not isinstance(value, (cst.Tuple, cst.List)):
                continue
            for target in statement.targets:
                elements = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else ()
                if len(elements) != len(value.elements):
                    continue
                for element, element_value in zip(elements, value.elements):
                    inner = element.value
                    if isinstance(inner, cst.Attribute) and isinstance(inner.value, cst.Name):
                        found.setdefault(inner.attr.value, []).append((inner, element_value.value))
    return found


def _unpacked_classes(names: NameIndex, bindings: List[Binding]) -> frozenset:
    # Asked for every load of a name: each binding's answer is worked out once per file, and the
    # answer for a scope's list of bindings of a name (what `bindings_of` gives every load that
    # sees it) once too: a name bound hundreds of times at module level is read as many times.
    known = _UNPACKED.get(names)
    if known is None:
        known = _UNPACKED[names] = {}
    if not bindings:
        return EMPTY
    key = ("list", id(bindings))  # a non-empty list is a scope's own, alive with the index
    answer = known.get(key)
    if answer is None:
        answer = known[key] = _unpacked_classes_of(names, known, bindings)
    return answer


def _unpacked_classes_of(names: NameIndex, known: Dict, bindings: List[Binding]) -> frozenset:
    result: frozenset = EMPTY
    for binding in bindings:
        classes = known.get(id(binding))
        if classes is None:
            value = unpacked_value(names, binding)
            classes = known[id(binding)] = EMPTY if value is None else names.instance_classes(value) & ANY_GRAD_SCALER
        result = result | classes if classes else result
    return result


_UNPACKED: "weakref.WeakKeyDictionary[NameIndex, Dict[int, frozenset]]" = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------------------ dict entries
def _dict_entry(names: NameIndex, node: cst.BaseExpression) -> Optional[Tuple[List[Binding], str, cst.BaseExpression]]:
    """`d["k"]` where every binding of `d` (a name or `self.d`) is a dict display with key "k"."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    index = node.slice[0].slice
    if not isinstance(index, cst.Index) or not isinstance(index.value, cst.SimpleString):
        return None
    key = index.value.evaluated_value
    bindings = storage_bindings(names, node.value)
    if bindings is None or len(bindings) != 1 or not isinstance(bindings[0].value, cst.Dict):
        return None
    for element in bindings[0].value.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            if element.key.evaluated_value == key:
                return bindings, key, element.value
    return None


# ------------------------------------------------------------------------------ class-level fields
def _class_field(names: NameIndex, node: cst.BaseExpression) -> Optional[Tuple[Scope, Binding]]:
    """`self.scaler` / `state.scaler` whose class declares `scaler` in its body."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return None
    scope = names.method_class_scope(node.value)
    if scope is not None and names.self_attribute_bindings(node):
        return None  # an ordinary `self.x = ...` attribute: scalers.py's own case
    if scope is None:
        scope = _instance_class_scope(names, node.value)
    if scope is None:
        return None
    bindings = scope.bindings.get(node.attr.value, [])
    if len(bindings) != 1 or bindings[0].kind not in ("annotation", "assign"):
        return None
    return scope, bindings[0]


def _instance_class_scope(names: NameIndex, name: cst.Name) -> Optional[Scope]:
    """The scope of the class of this file that `name` holds an instance of (made or annotated)."""
    scopes = set()
    for binding in names.bindings_of(name):
        source = None
        if isinstance(binding.value, cst.Call):
            source = binding.value.func
        elif binding.annotation is not None:
            source = binding.annotation
        if not isinstance(source, cst.Name):
            return None
        classes = [b for b in names.bindings_of(source) if b.kind == "class"]
        if len(classes) != 1:
            return None
        scopes.add(names.scope_entries.get(classes[0].node.body))
    return scopes.pop() if len(scopes) == 1 else None


def _field_classes(names: NameIndex, binding: Binding) -> frozenset:
    classes = set()
    if binding.annotation is not None:
        classes |= names.annotation_classes(binding.annotation) & ANY_GRAD_SCALER
    value = binding.value
    if isinstance(value, cst.Call):
        classes |= names.instance_classes(value) & ANY_GRAD_SCALER
        for arg in value.args:  # field(default_factory=GradScaler)
            if arg.keyword is not None and arg.keyword.value == "default_factory":
                factory = arg.value.body if isinstance(arg.value, cst.Lambda) else None
                classes |= names.qualified_names(arg.value) & ANY_GRAD_SCALER
                if factory is not None:
                    classes |= names.instance_classes(factory) & ANY_GRAD_SCALER
    return frozenset(classes)


# ------------------------------------------------------------------------------ scalers.py's hooks
def _container_candidates(names: NameIndex) -> Iterator[cst.BaseExpression]:
    for node in names.nodes_of_type(cst.Subscript):
        if _dict_entry(names, node) is not None:
            yield node


def _container_classes(names: NameIndex, node: cst.BaseExpression) -> frozenset:
    if isinstance(node, cst.Name):
        return _unpacked_classes(names, names.bindings_of(node))
    if isinstance(node, cst.Attribute):
        found = _class_field(names, node)
        if found is not None:
            return _field_classes(names, found[1])
        unpacked = tuple_self_attribute(names, node)
        if unpacked is not None:
            return names.instance_classes(unpacked[1]) & ANY_GRAD_SCALER
        return _unpacked_classes(names, names.self_attribute_bindings(node))
    entry = _dict_entry(names, node)
    if entry is not None:
        return names.instance_classes(entry[2]) & ANY_GRAD_SCALER
    return EMPTY


def _container_key(names: NameIndex, node: cst.BaseExpression) -> Optional[Tuple]:
    entry = _dict_entry(names, node)
    if entry is not None:
        return ("item", id(entry[0][0]), entry[1])
    if not isinstance(node, cst.Attribute):
        return None
    found = _class_field(names, node)
    if found is not None and _field_classes(names, found[1]):
        return ("field", id(found[0]), node.attr.value)
    unpacked = tuple_self_attribute(names, node)
    if unpacked is not None:
        return ("field", id(unpacked[0]), node.attr.value)
    return None


def _container_display(names: NameIndex, node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node)


def _container_creations(names: NameIndex, node: cst.BaseExpression) -> List[cst.Call]:
    value = None
    entry = _dict_entry(names, node)
    if entry is not None:
        value = entry[2]
    elif isinstance(node, cst.Attribute) and tuple_self_attribute(names, node) is not None:
        value = tuple_self_attribute(names, node)[1]
    else:
        for binding in storage_bindings(names, node) or ():
            value = unpacked_value(names, binding) or value
    if isinstance(value, cst.Call) and names.qualified_names(value.func) & ANY_GRAD_SCALER:
        return [value]
    return []
