"""Every use of `apex.amp` in a file, resolved through imports and scopes, and what it is.

`from apex import amp`, `import apex` + `apex.amp.X`, `import apex.amp as amp` and
`from apex.amp import scale_loss` all resolve to the same qualified names. The old handle API
(`handle = amp.init(...)`, `handle.scale_loss(...)`) is followed through the handle's bindings.
References to the module itself (`amp is None`, `assert amp`) are kept apart: they test whether
apex imported, and the migration has to rewrite them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import libcst as cst

from ampmigrate.api import APEX_AMP_API, APEX_AMP_MODULE
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import Binding, NameIndex


@dataclass(eq=False)
class AmpRef:
    node: cst.BaseExpression  # `amp.scale_loss` (the callee), or the module reference itself
    api: Optional[str]  # "initialize", "scale_loss", ...; None for the module (a presence test)
    call: Optional[cst.Call]  # the call when `node` is called
    via_handle: bool = False  # `handle.scale_loss(...)` of the old `amp.init()` API


@dataclass
class AmpUsage:
    refs: List[AmpRef]
    import_bindings: List[Binding]  # bindings of names to apex / apex.amp / apex.amp.X
    handle_bindings: List[Binding]  # `handle = amp.init(...)`


def amp_usage(ctx: FileContext) -> AmpUsage:
    return ctx.shared("apex.amp_usage", lambda: _collect(ctx))


def _called(names: NameIndex, node: cst.CSTNode) -> Optional[cst.Call]:
    parent = names.parent(node)
    return parent if isinstance(parent, cst.Call) and parent.func is node else None


def _collect(ctx: FileContext) -> AmpUsage:
    names = ctx.names
    refs: List[AmpRef] = []
    seen = set()
    for node, qnames in names.find(APEX_AMP_API):
        if node in names.store_attributes:
            continue
        api = APEX_AMP_API[sorted(qnames)[0]]
        # `amp._amp_state.loss_scalers` is found as `amp._amp_state`; deeper chains are its uses.
        refs.append(AmpRef(node, api, _called(names, node)))
        seen.add(node)
    for node, _ in names.find({APEX_AMP_MODULE}):
        parent = names.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            continue  # `amp.<something>`: an API use (found above) or an unknown attribute
        refs.append(AmpRef(node, None, _called(names, node)))
    # Unknown attributes of the module (`amp.something_new`) are uses the migration cannot map.
    for node, _ in names.find({APEX_AMP_MODULE}):
        parent = names.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node and parent not in seen:
            if f"{APEX_AMP_MODULE}.{parent.attr.value}" not in APEX_AMP_API:
                refs.append(AmpRef(parent, "unknown", _called(names, parent)))
    handle_bindings: List[Binding] = []
    for ref in list(refs):
        if ref.api != "init" or ref.call is None:
            continue
        assign = names.parent(ref.call)
        if not (isinstance(assign, cst.Assign) and assign.value is ref.call and len(assign.targets) == 1):
            continue
        target = assign.targets[0].target
        for binding in _bindings_at(names, target):
            handle_bindings.append(binding)
            for use in _binding_uses(names, binding):
                parent = names.parent(use)
                if isinstance(parent, cst.Attribute) and parent.value is use:
                    refs.append(AmpRef(parent, f"handle.{parent.attr.value}", _called(names, parent), via_handle=True))
                else:
                    refs.append(AmpRef(use, "handle", _called(names, use), via_handle=True))
    refs.sort(key=lambda r: (ctx.position(r.node).start.line, ctx.position(r.node).start.column))
    imports = [
        b
        for scope in names.scopes
        for bindings in scope.bindings.values()
        for b in bindings
        if b.kind in ("import", "from-import")
        and b.qname is not None
        and (b.qname == APEX_AMP_MODULE or b.qname in APEX_AMP_API or b.qname == "apex" and _uses_amp(names, b))
    ]
    return AmpUsage(refs, imports, handle_bindings)


def _uses_amp(names: NameIndex, binding: Binding) -> bool:
    """`import apex` counts as an apex.amp import only when it is used as `apex.amp`."""
    for ref in names.references(binding):
        parent = names.parent(ref)
        if isinstance(parent, cst.Attribute) and parent.value is ref and parent.attr.value == "amp":
            return True
    return False


def _bindings_at(names: NameIndex, target: cst.CSTNode) -> List[Binding]:
    """The binding(s) an assignment target creates (a name, or `self.x` in a method)."""
    scope = names.scope_of(target)
    if isinstance(target, cst.Name):
        return [b for b in scope.bindings.get(target.value, []) if b.node is target]
    if isinstance(target, cst.Attribute) and scope.parent is not None and scope.parent.kind == "class":
        return [b for b in scope.parent.self_attrs.get(target.attr.value, []) if b.node is target]
    return []


def _binding_uses(names: NameIndex, binding: Binding) -> List[cst.CSTNode]:
    """Loads of a name binding, or `self.x` reads of an attribute binding."""
    if isinstance(binding.node, cst.Name) and binding.kind != "annotation":
        return list(names.references(binding))
    uses = []
    for node in names.name_attributes:
        if node in names.store_attributes or not isinstance(node, cst.Attribute):
            continue
        if node.attr.value == binding.name and binding in names.self_attribute_bindings(node):
            uses.append(node)
    return uses
