"""Which objects in a file are GradScalers, and everything done with them.

A scaler is a name or a `self.<attr>` whose value comes from any GradScaler class (modern,
deprecated, sharded), a parameter annotated as one, or a parameter of a function of this file that
some call site in the file passes a scaler to (`train_one_epoch(..., scaler)`, `Trainer(scaler=s)`).
For each scaler we collect its creation calls, its method calls (`scale`, `unscale_`, `step`,
`update`, `state_dict`, ...) and every other reference (passed to a function, returned, stored):
rules that rewrite the protocol need to know that nothing escapes them.

Scalers linked by such a call or by an assignment (`self.scaler = scaler`) are one object at run
time; `family()` gives the linked group, and `escapes()` the references no rule can follow.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.analysis.scaler_typing import protocol_bindings
from ampmigrate.api import ANY_GRAD_SCALER
from ampmigrate.engine.context import FileContext
from ampmigrate.analysis.scaler_containers import (
    CONTAINER_KEYS,
    _container_candidates,
    _container_classes,
    _container_creations,
    _container_display,
    _container_key,
    storage_bindings,
)
from ampmigrate.engine.names import EMPTY, Binding, NameIndex

_MAX_PROPAGATION_ROUNDS = 4


@dataclass(eq=False)
class ScalerUse:
    call: cst.Call  # `scaler.step(optimizer)`
    method: str  # "step"
    receiver: cst.BaseExpression  # `scaler` / `self.scaler`


@dataclass(eq=False)
class Scaler:
    display: str  # "scaler" or "self.scaler"
    classes: FrozenSet[str]
    bindings: List[Binding] = field(default_factory=list)
    creations: List[cst.Call] = field(default_factory=list)  # GradScaler(...) calls that make it
    uses: List[ScalerUse] = field(default_factory=list)
    other_refs: List[cst.BaseExpression] = field(default_factory=list)
    # Scalers this one is the same run-time object as: passed to one of its parameters, or
    # assigned to it (both directions are recorded).
    links: List["Scaler"] = field(default_factory=list)

    def calls(self, method: str) -> List[ScalerUse]:
        return [use for use in self.uses if use.method == method]

    @property
    def is_attribute(self) -> bool:
        return self.display.startswith("self.")

    @property
    def disabled(self) -> bool:
        """Every way this object is made is `GradScaler(..., enabled=False)`: its methods are no-ops."""
        creations = [call for member in family(self) for call in member.creations]
        return bool(creations) and all(_enabled_literal(call) is False for call in creations)


def find_scalers(ctx: FileContext) -> List[Scaler]:
    """All scalers of the file (computed once per file, shared by the rules that ask)."""
    return ctx.shared("scalers", lambda: _find(ctx.names))


def protocol_scalers(ctx: FileContext) -> List[Scaler]:
    """`find_scalers`, plus the names a function uses as a GradScaler although their origin is
    not in sight (analysis/scaler_typing.py): what the protocol rules read."""
    return ctx.shared("scalers+protocol", lambda: _with_protocol_typing(ctx))


def _with_protocol_typing(ctx: FileContext) -> List[Scaler]:
    seed = protocol_bindings(ctx.names)
    return _find(ctx.names, seed) if seed else find_scalers(ctx)


def family(scaler: Scaler) -> List[Scaler]:
    """`scaler` and every scaler linked to it, directly or through others."""
    seen: List[Scaler] = [scaler]
    index = 0
    while index < len(seen):
        for other in seen[index].links:
            if other not in seen:
                seen.append(other)
        index += 1
    return seen


def escapes(names: NameIndex, scaler: Scaler) -> List[cst.BaseExpression]:
    """References of `scaler` that leave what this file's analysis can follow.

    Not escapes: truth tests (`if scaler:`, `scaler is not None`), and passing it to a parameter
    or assigning it to a name or attribute that is itself a linked scaler.
    """
    linked_targets: Set[cst.CSTNode] = set()
    for other in scaler.links:
        for binding in other.bindings:
            linked_targets.add(binding.node)
    out: List[cst.BaseExpression] = []
    for ref in scaler.other_refs:
        if _is_truth_test(names, ref):
            continue
        parent = names.parent(ref)
        if isinstance(parent, cst.Arg) and _linked_parameter(names, parent, linked_targets):
            continue
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is ref:
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            if all(t in linked_targets for t in targets):
                continue
        out.append(ref)
    return out


# ------------------------------------------------------------------------------------ discovery
def _key(names: NameIndex, node: cst.BaseExpression) -> Optional[Tuple]:
    container = _container_key(names, node)
    if container is not None:
        return container
    if isinstance(node, cst.Name):
        bindings = names.bindings_of(node)
        return ("name", tuple(id(b) for b in bindings)) if bindings else None
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        bindings = names.self_attribute_bindings(node)
        if bindings:
            return ("attr", id(bindings[0].scope), node.attr.value)
    return None


def _find(names: NameIndex, seed: Optional[Dict[Binding, FrozenSet[str]]] = None) -> List[Scaler]:
    # Parameter bindings that some call site binds to a scaler (or typed by protocol: `seed`),
    # with that scaler's classes.
    received: Dict[Binding, FrozenSet[str]] = dict(seed or {})
    scalers = _discover(names, received)
    for _ in range(_MAX_PROPAGATION_ROUNDS):
        grown = False
        for scaler in scalers:
            for ref in scaler.other_refs:
                for binding in _receiving_parameters(names, ref):
                    if binding not in received:
                        received[binding] = scaler.classes
                        grown = True
        if not grown:
            break
        scalers = _discover(names, received)
    _link(names, scalers)
    return scalers


def _classes(
    names: NameIndex,
    node: cst.BaseExpression,
    received: Dict[Binding, FrozenSet[str]],
    depth: int = 0,
    followed: Optional[Dict[Tuple[int, int], FrozenSet[str]]] = None,
) -> FrozenSet[str]:
    """The GradScaler classes `node` can hold. `followed`: answers of one `received` (one
    round of `_find`) by (id of a bindings list, depth): what the bindings lead to depends on
    nothing else, and a name bound many times is asked about at each of its loads."""
    known = _OWN_CLASSES.get(names)
    if known is None:
        known = _OWN_CLASSES[names] = {}
    classes = known.get(id(node))
    if classes is None:
        # What the node itself shows, whatever the parameters received: every load of the file
        # is asked in each round of `_find`, and `_find` runs twice (with and without protocol
        # typing), so this is worked out once per node.
        classes = known[id(node)] = (names.instance_classes(node) & ANY_GRAD_SCALER) or _container_classes(names, node)
    if classes or not received or depth > 3:
        return classes
    bindings = storage_bindings(names, node)
    if bindings is None:
        return EMPTY
    key = (id(bindings), depth)  # a non-empty list is the scope's own (an empty one may be new)
    if followed is not None and bindings:
        known_answer = followed.get(key)
        if known_answer is not None:
            return known_answer
    result: Set[str] = set()
    for binding in bindings:
        if binding in received:
            result |= received[binding]
        elif binding.kind in ("assign", "walrus") and isinstance(binding.value, (cst.Name, cst.Attribute)):
            result |= _classes(names, binding.value, received, depth + 1, followed)
    answer = frozenset(result)
    if followed is not None and bindings:
        followed[key] = answer
    return answer


_OWN_CLASSES: "weakref.WeakKeyDictionary[NameIndex, Dict[int, FrozenSet[str]]]" = weakref.WeakKeyDictionary()


def _discover(names: NameIndex, received: Dict[Binding, FrozenSet[str]]) -> List[Scaler]:
    scalers: Dict[Tuple, Scaler] = {}
    candidates: List[cst.BaseExpression] = list(names.loads)
    candidates.extend(a for a in names.name_attributes if a not in names.store_attributes)
    candidates.extend(_container_candidates(names))
    followed: Dict[Tuple[int, int], FrozenSet[str]] = {}
    for node in candidates:
        classes = _classes(names, node, received, 0, followed)
        if not classes:
            continue
        key = _key(names, node)
        if key is None:
            continue
        scaler = scalers.get(key)
        if scaler is None:
            if key[0] in CONTAINER_KEYS:
                display, bindings = _container_display(names, node), []
            else:
                display = node.value if isinstance(node, cst.Name) else f"self.{node.attr.value}"
                bindings = names.bindings_of(node) if isinstance(node, cst.Name) else names.self_attribute_bindings(node)
            scaler = scalers[key] = Scaler(display, classes, list(bindings))
            scaler.creations.extend(c for c in _container_creations(names, node) if c not in scaler.creations)
            for binding in bindings:
                value = binding.value
                if isinstance(value, cst.Call) and names.qualified_names(value.func) & ANY_GRAD_SCALER:
                    scaler.creations.append(value)
                elif isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                    # `GradScaler() if amp else None`, `scaler or GradScaler()`
                    scaler.creations.extend(_creation_calls(names, value))
        if isinstance(node, cst.Name) and node.value == "self":
            continue
        parent = names.parent(node)
        grandparent = names.parent(parent) if parent is not None else None
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and isinstance(grandparent, cst.Call)
            and grandparent.func is parent
        ):
            scaler.uses.append(ScalerUse(grandparent, parent.attr.value, node))
        else:
            scaler.other_refs.append(node)
    return list(scalers.values())


def _creation_calls(names: NameIndex, value: cst.BaseExpression) -> List[cst.Call]:
    if isinstance(value, cst.Call):
        return [value] if names.qualified_names(value.func) & ANY_GRAD_SCALER else []
    if isinstance(value, cst.IfExp):
        return _creation_calls(names, value.body) + _creation_calls(names, value.orelse)
    if isinstance(value, cst.BooleanOperation):
        return _creation_calls(names, value.left) + _creation_calls(names, value.right)
    return []


def _enabled_literal(call: cst.Call) -> Optional[bool]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "enabled" and isinstance(arg.value, cst.Name):
            if arg.value.value in ("True", "False"):
                return arg.value.value == "True"
    return None


def _link(names: NameIndex, scalers: Sequence[Scaler]) -> None:
    by_binding: Dict[int, Scaler] = {}
    for scaler in scalers:
        for binding in scaler.bindings:
            by_binding[id(binding)] = scaler
    for scaler in scalers:
        targets: List[Binding] = []
        for ref in scaler.other_refs:
            targets.extend(_receiving_parameters(names, ref))
            parent = names.parent(ref)
            if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is ref:
                targets.extend(_assignment_bindings(names, parent))
        for binding in targets:
            other = by_binding.get(id(binding))
            if other is not None and other is not scaler:
                if other not in scaler.links:
                    scaler.links.append(other)
                if scaler not in other.links:
                    other.links.append(scaler)


def _assignment_bindings(names: NameIndex, statement: cst.CSTNode) -> List[Binding]:
    """The bindings (names or `self.<attr>`) that `statement` creates."""
    found: List[Binding] = []
    scope = names.scope_of(statement)
    for bindings in scope.bindings.values():
        found.extend(b for b in bindings if b.statement is statement)
    if scope.parent is not None and scope.parent.kind == "class":
        for bindings in scope.parent.self_attrs.values():
            found.extend(b for b in bindings if b.statement is statement)
    return found


# ------------------------------------------------------------------------------------ call sites
def _is_truth_test(names: NameIndex, ref: cst.BaseExpression) -> bool:
    parent = names.parent(ref)
    if isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is ref:
        return True
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        return True
    if isinstance(parent, cst.Comparison) and parent.left is ref:
        return all(
            isinstance(target.operator, (cst.Is, cst.IsNot))
            and isinstance(target.comparator, cst.Name)
            and target.comparator.value == "None"
            for target in parent.comparisons
        )
    if isinstance(parent, cst.BooleanOperation):
        grandparent = names.parent(parent)
        return isinstance(grandparent, (cst.If, cst.While, cst.IfExp, cst.BooleanOperation, cst.UnaryOperation))
    return False


def _linked_parameter(names: NameIndex, arg: cst.Arg, linked_targets: Set[cst.CSTNode]) -> bool:
    bindings = _parameter_bindings(names, arg)
    return bool(bindings) and all(b.node in linked_targets for b in bindings)


def _receiving_parameters(names: NameIndex, ref: cst.BaseExpression) -> List[Binding]:
    """If `ref` is an argument of a call to a function of this file: the parameter it binds."""
    parent = names.parent(ref)
    if not isinstance(parent, cst.Arg) or parent.value is not ref:
        return []
    return _parameter_bindings(names, parent)


def _parameter_bindings(names: NameIndex, arg: cst.Arg) -> List[Binding]:
    call = names.parent(arg)
    if not isinstance(call, cst.Call) or arg.star:
        return []
    found: List[Binding] = []
    for func, offset in callee_definitions(names, call.func):
        param = _parameter_for(func, call, arg, offset)
        if param is None:
            continue
        scope = names.scope_entries.get(func.body)
        if scope is None:
            continue
        found.extend(b for b in scope.bindings.get(param.name.value, []) if b.kind == "param" and b.node is param.name)
    return found


def callee_definitions(names: NameIndex, func: cst.BaseExpression) -> List[Tuple[cst.FunctionDef, int]]:
    """The functions of this file that a call of `func` runs, with how many leading parameters
    the call does not pass (1 for a method called on an instance or a class being constructed).

    `f(...)` where every binding of `f` is a `def`; `Cls(...)` (its `__init__`); `self.method(...)`
    inside a method of a class that defines (or whose base class here defines) `method`.
    Anything else: [].
    """
    if isinstance(func, cst.Name):
        bindings = names.bindings_of(func)
        if not bindings:
            return []
        if all(b.kind == "def" for b in bindings):
            return [(b.node, _implicit_parameters(b.node, bound=False)) for b in bindings]
        if all(b.kind == "class" for b in bindings):
            inits = []
            for b in bindings:
                init = class_method(names, b.node, "__init__")
                if init is not None:
                    inits.append((init, 1))
            return inits
        return []
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        class_scope = names.method_class_scope(func.value)
        if class_scope is None:
            return []
        method = class_method(names, class_scope.node, func.attr.value)
        if method is None:
            return []
        return [(method, _implicit_parameters(method, bound=True))]
    return []


def class_method(names: NameIndex, class_def: cst.ClassDef, method: str, depth: int = 0) -> Optional[cst.FunctionDef]:
    """The `def method` of a class of this file, or of a base class defined in this file."""
    scope = names.scope_entries.get(class_def.body)
    if scope is None or depth > 5:
        return None
    bindings = scope.bindings.get(method, [])
    if bindings:
        return bindings[0].node if len(bindings) == 1 and bindings[0].kind == "def" else None
    for base in local_bases(names, class_def):
        found = class_method(names, base, method, depth + 1)
        if found is not None:
            return found
    return None


def local_bases(names: NameIndex, class_def: cst.ClassDef) -> List[cst.ClassDef]:
    """Base classes of `class_def` that are defined in this file."""
    bases: List[cst.ClassDef] = []
    for arg in class_def.bases:
        if isinstance(arg.value, cst.Name):
            for binding in names.bindings_of(arg.value):
                if binding.kind == "class":
                    bases.append(binding.node)
    return bases


def _implicit_parameters(func: cst.FunctionDef, bound: bool) -> int:
    decorators = {d.decorator.value for d in func.decorators if isinstance(d.decorator, cst.Name)}
    if "staticmethod" in decorators:
        return 0
    if "classmethod" in decorators:
        return 1
    return 1 if bound else 0


def _parameter_for(func: cst.FunctionDef, call: cst.Call, arg: cst.Arg, offset: int) -> Optional[cst.Param]:
    params = func.params
    if arg.keyword is not None:
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value == arg.keyword.value:
                return param
        return None
    index = 0
    for other in call.args:
        if other is arg:
            break
        if other.star or other.keyword is not None:
            return None
        index += 1
    positional = [*params.posonly_params, *params.params]
    index += offset
    return positional[index] if index < len(positional) else None
