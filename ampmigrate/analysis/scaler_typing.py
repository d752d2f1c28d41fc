"""GradScalers known by what is done with them, not by where they are made.

The commonest real shape makes the scaler in one file and uses it in another:
`train_one_epoch(model, ..., loss_scaler, max_norm)` in engine.py, a `train_step(..., scaler)`
helper nobody in its file calls, `self.grad_scaler` built by a factory. None of those names
resolves to a GradScaler class. Within one function, though, an object on which both
`x.scale(loss).backward()` and `x.step(opt)` (or `x.unscale_(opt)`, `x.update()`) are called
follows the GradScaler protocol (torch.amp.GradScaler's documented recipe), and nothing else in
the torch ecosystem is spelled that way: that is the name's type.

Precision first: a name whose value visibly comes from something else (a class of this file, an
import that is not a GradScaler, a timm/DeiT `NativeScaler`-style wrapper called as
`loss_scaler(loss, optimizer, ...)`, which unscales internally) is never typed, and the
`.scale(...)` call must feed `.backward()` directly.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.api import ANY_GRAD_SCALER
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.engine.names import Binding, NameIndex

# What a protocol-typed scaler is taken for: torch.amp.GradScaler (the current class; the rules
# reading the protocol treat every GradScaler class alike).
PROTOCOL_CLASSES: FrozenSet[str] = frozenset({"torch.amp.GradScaler"})
_FOLLOW_UPS = frozenset({"step", "unscale_", "update"})


def protocol_bindings(names: NameIndex) -> Dict[Binding, FrozenSet[str]]:
    """Bindings (parameters, assignments, `self.<attr> = ...`) of the names that some function
    of the file uses as a GradScaler, each with PROTOCOL_CLASSES."""
    # (function, receiver key) -> methods seen, and the receivers spelling it
    seen: Dict[Tuple[int, Tuple], Set[str]] = {}
    receivers: Dict[Tuple[int, Tuple], cst.BaseExpression] = {}
    for call in names.nodes_of_type(cst.Call):
        func = call.func
        if not isinstance(func, cst.Attribute):
            continue
        method = func.attr.value
        if method != "scale" and method not in _FOLLOW_UPS:
            continue
        receiver = func.value
        key = _receiver_key(names, receiver)
        if key is None or not _protocol_call(names, call, method):
            continue
        owner = names.enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
        slot = (id(owner), key)
        seen.setdefault(slot, set()).add(method)
        receivers.setdefault(slot, receiver)
    found: Dict[Binding, FrozenSet[str]] = {}
    for slot, methods in seen.items():
        if "scale" not in methods or not methods & _FOLLOW_UPS:
            continue
        receiver = receivers[slot]
        bindings = _bindings(names, receiver)
        if bindings and not any(_excluded(names, binding) for binding in bindings):
            for binding in bindings:
                found[binding] = PROTOCOL_CLASSES
    return found


def _receiver_key(names: NameIndex, receiver: cst.BaseExpression) -> Optional[Tuple]:
    if isinstance(receiver, cst.Name):
        if receiver.value == "self" or names.qualified_names(receiver):
            return None  # a module, an imported object: not a scaler of this code
        return ("name", receiver.value)
    if isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name):
        if names.method_class_scope(receiver.value) is not None:
            return ("attr", receiver.attr.value)
    return None


def _protocol_call(names: NameIndex, call: cst.Call, method: str) -> bool:
    """The call has a GradScaler method's shape: `scale(x)` feeding `.backward()`, `step(opt)` /
    `unscale_(opt)` with one optimizer, `update()` / `update(new_scale)`."""
    args = [a for a in call.args if not a.star]
    if len(args) != len(call.args):
        return False
    if method == "scale":
        if len(args) != 1 or args[0].keyword is not None:
            return False
        attribute = names.parent(call)
        backward = names.parent(attribute) if attribute is not None else None
        return (
            isinstance(attribute, cst.Attribute)
            and attribute.value is call
            and attribute.attr.value == "backward"
            and isinstance(backward, cst.Call)
            and backward.func is attribute
        )
    if method in ("step", "unscale_"):
        return len(args) == 1 and (args[0].keyword is None or args[0].keyword.value == "optimizer")
    return len(args) <= 1  # update()


def _bindings(names: NameIndex, receiver: cst.BaseExpression) -> List[Binding]:
    if isinstance(receiver, cst.Name):
        return names.bindings_of(receiver)
    if isinstance(receiver, cst.Attribute):
        return names.self_attribute_bindings(receiver)
    return []


def _excluded(names: NameIndex, binding: Binding) -> bool:
    """The binding shows the value is something other than a GradScaler (or cannot tell at all)."""
    if binding.kind not in ("param", "assign", "annotation"):
        return True  # an import, a def, a loop variable, ...
    classes = names._bindings_instance_classes([binding])
    if classes:
        return not classes & ANY_GRAD_SCALER
    value = binding.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        # `LossScaler()` of a class defined here: that class, not a GradScaler.
        return any(b.kind == "class" for b in names.bindings_of(value.func))
    return False


# ---------------------------------------------------------------------------------- the ast screen
def has_protocol_shape(tree: ast.AST) -> bool:
    """A sound, cheap over-approximation of `protocol_bindings` on the `ast`: some `.scale(x)`
    call feeds `.backward()`, and `.step`/`.unscale_`/`.update` is called on something."""
    scaled = follow_up = False
    for node in nodes_of(tree, ast.Call):
        if not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        if attr == "backward":
            inner = node.func.value
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "scale":
                scaled = True
        elif attr in _FOLLOW_UPS:
            follow_up = True
        if scaled and follow_up:
            return True
    return False
