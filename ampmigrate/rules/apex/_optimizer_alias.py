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
    for binding in names.bindings_of(optimizer):
        if binding.kind != "assign" or binding.scope.kind != "function":
            return set()
        statement = binding.statement
        if isinstance(statement, cst.Assign) and _initialize_returning(planner, statement.value, optimizer.value):
            continue  # apex handed back the object it was given
        value = binding.value
        if value is None or not isinstance(value, (cst.Name, cst.Attribute)) or not is_pure(value):
            return set()
        sources.append(value)
    if len(sources) != 1:
        return set()
    source = sources[0]
    key = expression_key(source)
    function = planner._function_scope(optimizer).node
    root = source
    while isinstance(root, cst.Attribute):
        root = root.value
    for node in walk(function):
        if isinstance(node, cst.Attribute) and node in names.store_attributes and expression_key(node) == key:
            return set()  # `self.optimizer = ...` in the function: the copy may be stale
    if isinstance(root, cst.Name) and any(b.kind not in ("param",) for b in names.bindings_of(root)):
        return set()  # `self` rebound, or a local the copy came from
    return {key}


def _initialize_returning(planner, value, name: str) -> bool:
    """`amp.initialize(..., <name>, ...)`: the call hands `name`'s optimizer back."""
    if not isinstance(value, cst.Call):
        return False
    if not any(q == f"{APEX_AMP_MODULE}.initialize" or q.endswith(".amp.initialize") for q in planner.names.qualified_names(value.func)):
        return False
    bound = bound_arguments(value, INITIALIZE_PARAMS) or {}
    given = bound.get("optimizers")
    return given is not None and isinstance(given.value, cst.Name) and given.value.value == name
