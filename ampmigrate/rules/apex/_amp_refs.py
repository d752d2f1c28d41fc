"""Every use of `apex.amp` in a file, resolved through imports and scopes, and what it is.

`from apex import amp`, `import apex` + `apex.amp.X`, `import apex.amp as amp` and
`from apex.amp import scale_loss` all resolve to the same qualified names. The old handle API
(`handle = amp.init(...)`, `handle.scale_loss(...)`) is followed through the handle's bindings.
References to the module itself (`amp is None`, `assert amp`) are kept apart: they test whether
apex imported, and the migration has to rewrite them too.

The module handed to a function of the same file (`train(model, opt, amp)` in `main()`, with
`def train(model, optimizer, amp):` using `amp.scale_loss`) is followed into it: when every call
of the function passes apex's amp in the same parameter, that parameter's uses are apex uses too
(a presence test of `amp is not None` included), and the arguments are kept apart as "pass"
references, where the migration passes the GradScaler instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.api import APEX_AMP_API, APEX_AMP_MODULE
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import Binding, NameIndex
from ampmigrate.rules.apex._amp_carrier import Carrier, find_carrier
from ampmigrate.rules.apex._amp_options import INITIALIZE_PARAMS
from ampmigrate.rules.apex._keyword_dict import register as register_keyword_dict
from ampmigrate.rules.apex._state_loader_args import mark_state_loader_args
from ampmigrate.rules.apex._checkpoint_entries import mark_checkpoint_entries
from ampmigrate.rules.apex._passed_training import mark_train_param_args
from ampmigrate.rules.apex._state_params_elsewhere import mark_state_param_args


@dataclass(eq=False)
class AmpRef:
    node: cst.BaseExpression  # `amp.scale_loss` (the callee), or the module reference itself
    api: Optional[str]  # "initialize", "scale_loss", ...; None for the module (a presence test)
    call: Optional[cst.Call]  # the call when `node` is called
    via_handle: bool = False  # `handle.scale_loss(...)` of the old `amp.init()` API
    # api "pass": the argument that hands the module to a function of this file; `slot` is the
    # parameter that receives it there.
    slot: Optional[cst.Param] = None
    # `args.amp.scale_loss`: the object carrying apex's module (`args`, _amp_carrier.py); api
    # "carry" marks the module stored on it (`args.amp = amp`).
    carrier: Optional[cst.BaseExpression] = None
    # api "state_pass": the module handed to a checkpoint helper of another file, (its file, the
    # function, the parameter) (_state_params_elsewhere.py); api "train_pass": to a training
    # function of another file (_passed_training.py); api "save_entry": a value of a checkpoint
    # handler's `to_save` dict (_checkpoint_entries.py)
    elsewhere: Optional[Tuple[str, str, str]] = None


@dataclass
class AmpUsage:
    refs: List[AmpRef]
    import_bindings: List[Binding]  # bindings of names to apex / apex.amp / apex.amp.X
    handle_bindings: List[Binding]  # `handle = amp.init(...)`
    # Functions of this file that receive apex's amp module: FunctionDef -> the parameter.
    slots: Dict[cst.FunctionDef, cst.Param] = field(default_factory=dict)
    carrier: Optional[Carrier] = None  # the attribute carrying the module, if any (_amp_carrier.py)


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
    for ref in refs:
        if ref.api == "initialize" and ref.call is not None and any(arg.star for arg in ref.call.args):
            register_keyword_dict(names, ref.call, INITIALIZE_PARAMS)  # `**amp_args` (_keyword_dict.py)
    slots = _follow_into_functions(ctx, refs)
    mark_state_loader_args(ctx, refs)  # `restart_from_checkpoint(..., amp=apex.amp)` (_state_loader_args.py)
    mark_checkpoint_entries(ctx, refs)  # ignite's `to_save={"amp": amp}` (_checkpoint_entries.py)
    mark_state_param_args(ctx, refs)  # `state.track_amp_state(amp)` (_state_params_elsewhere.py)
    mark_train_param_args(ctx, refs)  # `train_one_epoch(..., amp)` of another file (_passed_training.py)
    carrier = find_carrier(ctx, refs)
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
    return AmpUsage(refs, imports, handle_bindings, slots, carrier)


def _follow_into_functions(ctx: FileContext, refs: List[AmpRef]) -> Dict[cst.FunctionDef, cst.Param]:
    """Turn the arguments that pass the module to a module-level function of this file into
    "pass" references, and add that function's uses of its parameter (see the module docstring).
    Only when every reference to the function is a call passing the module in that parameter,
    nothing rebinds the parameter, and no other file of the run imports the function."""
    names = ctx.names
    passed: Dict[cst.FunctionDef, List[Tuple[AmpRef, cst.Param]]] = {}
    for ref in refs:
        if ref.api is not None:
            continue
        arg = names.parent(ref.node)
        call = names.parent(arg) if isinstance(arg, cst.Arg) else None
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and not arg.star):
            continue
        bindings = names.bindings_of(call.func)
        if len(bindings) != 1 or bindings[0].kind != "def" or bindings[0].scope is not names.module_scope:
            continue
        function = bindings[0].node
        param = _parameter_for(function, call, arg)
        if param is not None:
            passed.setdefault(function, []).append((ref, param))
    slots: Dict[cst.FunctionDef, cst.Param] = {}
    for function, pairs in passed.items():
        params = {id(p) for _, p in pairs}
        binding = next(b for b in names.module_scope.bindings[function.name.value] if b.node is function)
        if ctx.imported_by_others(binding):
            continue  # callers elsewhere pass what they pass, positionally or by name
        calls = names.references(binding)
        if len(params) != 1 or len(pairs) != len(calls):
            continue  # another parameter, or a call (or use) that does not pass the module
        passing = {id(names.parent(names.parent(r.node))) for r, _ in pairs}
        if any(not (isinstance(names.parent(c), cst.Call) and names.parent(c).func is c and id(names.parent(c)) in passing) for c in calls):
            continue
        param = pairs[0][1]
        scope = names.scope_of(function.body)
        param_bindings = scope.bindings.get(param.name.value, [])
        if len(param_bindings) != 1 or param_bindings[0].kind != "param":
            continue  # rebound inside the function
        slots[function] = param
        for ref, _ in pairs:
            ref.api, ref.slot = "pass", param
        for use in names.references(param_bindings[0]):
            parent = names.parent(use)
            if isinstance(parent, cst.Attribute) and parent.value is use:
                api = APEX_AMP_API.get(f"{APEX_AMP_MODULE}.{parent.attr.value}", "unknown")
                refs.append(AmpRef(parent, api, _called(names, parent)))
            else:
                refs.append(AmpRef(use, None, _called(names, use)))
    return slots


def _parameter_for(function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> Optional[cst.Param]:
    """The parameter of `function` that `arg` of `call` binds (positional or keyword)."""
    params = function.params
    positional = [*params.posonly_params, *params.params]
    if arg.keyword is not None:
        for param in [*params.params, *params.kwonly_params]:
            if param.name.value == arg.keyword.value:
                return param
        return None
    position = 0
    for other in call.args:
        if other.star or other.keyword is not None:
            return None
        if other is arg:
            return positional[position] if position < len(positional) else None
        position += 1
    return None


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
