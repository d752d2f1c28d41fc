"""Which objects in a file are GradScalers, and everything done with them.

A scaler is a name or a `self.<attr>` whose value comes from any GradScaler class (modern,
deprecated, sharded), or a parameter annotated as one. For each scaler we collect its creation
calls, its method calls (`scale`, `unscale_`, `step`, `update`, `state_dict`, ...) and every other
reference (passed to a function, returned, stored): rules that rewrite the protocol need to know
that nothing escapes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

import libcst as cst

from ampmigrate.api import ANY_GRAD_SCALER
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import Binding, NameIndex, Scope


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

    def calls(self, method: str) -> List[ScalerUse]:
        return [use for use in self.uses if use.method == method]

    @property
    def is_attribute(self) -> bool:
        return self.display.startswith("self.")


def find_scalers(ctx: FileContext) -> List[Scaler]:
    """All scalers of the file (computed once per file, shared by the rules that ask)."""
    return ctx.shared("scalers", lambda: _find(ctx.names))


def _key(names: NameIndex, node: cst.BaseExpression) -> Optional[Tuple]:
    if isinstance(node, cst.Name):
        bindings = names.bindings_of(node)
        return ("name", tuple(id(b) for b in bindings)) if bindings else None
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        bindings = names.self_attribute_bindings(node)
        if bindings:
            return ("attr", id(bindings[0].scope), node.attr.value)
    return None


def _find(names: NameIndex) -> List[Scaler]:
    scalers: Dict[Tuple, Scaler] = {}
    candidates: List[cst.BaseExpression] = list(names.loads)
    candidates.extend(a for a in names.name_attributes if a not in names.store_attributes)
    for node in candidates:
        classes = names.instance_classes(node) & ANY_GRAD_SCALER
        if not classes:
            continue
        key = _key(names, node)
        if key is None:
            continue
        scaler = scalers.get(key)
        if scaler is None:
            display = node.value if isinstance(node, cst.Name) else f"self.{node.attr.value}"
            bindings = names.bindings_of(node) if isinstance(node, cst.Name) else names.self_attribute_bindings(node)
            scaler = scalers[key] = Scaler(display, classes, list(bindings))
            for binding in bindings:
                value = binding.value
                if isinstance(value, cst.Call) and names.qualified_names(value.func) & ANY_GRAD_SCALER:
                    scaler.creations.append(value)
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
