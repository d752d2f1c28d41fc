"""The optimizer `amp.scale_loss` is given, spelled another way where it steps.

    optimizer = self.optimizer
    if self.args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    ...
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    ...
    self.optimizer.step()

(luke's legacy trainer). apex returns the optimizer object it was given, so `optimizer` and
`self.optimizer` are one object, and the step on the attribute is the step of the scaled loss:
GradScaler keys its per-optimizer state by the object, so `scaler.step(self.optimizer)` after
`scaler.unscale_(optimizer)` is the same optimizer. Followed only when the local name is bound in
its function by one plain copy of a name or attribute and by `amp.initialize` calls given the name
itself, and nothing in the function stores to the attribute (or rebinds the name) it copies.
"""

from __future__ import annotations

from typing import Set

import libcst as cst

from ampmigrate.analysis.statements import expression_key, is_pure, walk
from ampmigrate.api import APEX_AMP_MODULE
from ampmigrate.rules.apex._amp_options import INITIALIZE_PARAMS, bound_arguments


def optimizer_aliases(planner, optimizer: cst.BaseExpression) -> Set[object]:
    """The expression keys of the other spellings of `optimizer` (see the module docstring)."""
    if not isinstance(optimizer, cst.Name):
        return set()
    names = planner.names
    sources = []
    bindings = names.bindings_of(optimizer)
    for binding in bindings:
        if binding.kind != "assign" or binding.scope.kind != "function":
            return _copies_of(planner, optimizer, bindings)
        statement = binding.statement
        if isinstance(statement, cst.Assign) and _initialize_returning(planner, statement.value, optimizer.value):
            continue  # apex handed back the object it was given
        given = _initialize_given(planner, statement, optimizer.value)
        value = given if given is not None else binding.value
        if value is None or not isinstance(value, (cst.Name, cst.Attribute)) or not is_pure(value):
            return _copies_of(planner, optimizer, bindings)
        sources.append(value)
    if len(sources) != 1:
        return _copies_of(planner, optimizer, bindings)
    source = sources[0]
    key = expression_key(source)
    function = planner._function_scope(optimizer).node
    root = source
    while isinstance(root, cst.Attribute):
        root = root.value
    for node in walk(function):
        if isinstance(node, cst.Attribute) and node in names.store_attributes and expression_key(node) == key:
            return set()  # `self.optimizer = ...` in the function: the copy may be stale
    if isinstance(root, cst.Name) and root is not source and any(b.kind not in ("param",) for b in names.bindings_of(root)):
        return set()  # `self` rebound
    if isinstance(source, cst.Name) and len(names.bindings_of(source)) != 1:
        return set()  # a local the copy came from, rebound: the copy may be stale
    return {key}


def _initialize_given(planner, statement, name: str):
    """`net, <name> = amp.initialize(model, optim)`: the optimizer argument apex handed back into
    `name` (the same object: apex returns the optimizers it is given), else None."""
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
        return None
    call = statement.value
    if not isinstance(call, cst.Call) or not any(
        q == f"{APEX_AMP_MODULE}.initialize" or q.endswith(".amp.initialize") for q in planner.names.qualified_names(call.func)
    ):
        return None
    bound = bound_arguments(call, INITIALIZE_PARAMS) or {}
    models, optimizers = bound.get("models"), bound.get("optimizers")
    target = statement.targets[0].target
    if models is None or optimizers is None or not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
        return None
    second = target.elements[1].value
    if not (isinstance(second, cst.Name) and second.value == name) or isinstance(optimizers.value, (cst.List, cst.Tuple)):
        return None
    return optimizers.value


def _copies_of(planner, optimizer: cst.Name, bindings) -> Set[object]:
    """Locals of the function that hold the object `optimizer` names, once bound: every binding
    of theirs a plain copy of it (`step_optimizer = optimizer`) or `amp.initialize(..., optimizer)`
    handing it back into them (open_lth's `model, step_optimizer = amp.initialize(model,
    optimizer)`)."""
    if len(bindings) != 1 or bindings[0].kind not in ("assign", "param"):
        return set()
    scope = planner._function_scope(optimizer)
    if scope.kind != "function":
        return set()
    found: Set[object] = set()
    for name, others in scope.bindings.items():
        if name == optimizer.value or not others:
            continue
        if all(
            b.kind == "assign" and b.scope is scope and (
                (isinstance(b.value, cst.Name) and b.value.value == optimizer.value and b.statement is not None
                 and isinstance(b.statement, cst.Assign) and b.statement.value is b.value)
                or _initialize_given(planner, b.statement, name) is not None
                and isinstance(_initialize_given(planner, b.statement, name), cst.Name)
                and _initialize_given(planner, b.statement, name).value == optimizer.value
            )
            for b in others
        ):
            found.add(expression_key(cst.Name(name)))
    return found


def _initialize_returning(planner, value, name: str) -> bool:
    """`amp.initialize(..., <name>, ...)`: the call hands `name`'s optimizer back."""
    if not isinstance(value, cst.Call):
        return False
    if not any(q == f"{APEX_AMP_MODULE}.initialize" or q.endswith(".amp.initialize") for q in planner.names.qualified_names(value.func)):
        return False
    bound = bound_arguments(value, INITIALIZE_PARAMS) or {}
    given = bound.get("optimizers")
    return given is not None and isinstance(given.value, cst.Name) and given.value.value == name
