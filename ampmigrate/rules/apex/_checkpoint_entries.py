"""apex's amp module as an entry of the objects a checkpoint handler saves.

PyTorch-Ignite's documented apex recipe checkpoints `to_save={"model": model, "optimizer":
optimizer, "amp": amp}` (`Checkpoint(to_save, ...)`, or `engine.add_event_handler(event,
ModelCheckpoint(...), to_save={...})`); the handler calls `state_dict()` on each value
(https://pytorch.org/ignite/generated/ignite.handlers.checkpoint.Checkpoint.html). A GradScaler
has the same `state_dict()`, so the entry becomes `"amp": scaler` (api "save_entry"): the key
stays, and the file's `amp.load_state_dict(checkpoint["amp"])` becomes the guarded load of the
scaler (_state_load_guard.py), which also takes what apex saved.

Only saving: a `to_load` dict would hand apex's `{"loss_scaler0": ...}` to
`GradScaler.load_state_dict`, which cannot read it; such an entry stays a value use the fix does
not follow. The dict must be written in the call (`to_save={...}`, or `Checkpoint`'s first
argument), or bound once to a name used only so (`to_save = {...}`), in a file that imports
ignite.
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.engine.context import FileContext

_CHECKPOINT_CLASSES = frozenset({"ignite.handlers.Checkpoint", "ignite.handlers.checkpoint.Checkpoint"})


def mark_checkpoint_entries(ctx: FileContext, refs) -> None:
    """Module references that are a value of a `to_save` dict become api "save_entry"."""
    names = ctx.names
    if not any(q.startswith("ignite.") for _, qnames in names.qualified_expressions() for q in qnames):
        return
    for ref in refs:
        if ref.api is not None:
            continue
        element = names.parent(ref.node)
        if not (isinstance(element, cst.DictElement) and element.value is ref.node):
            continue
        mapping = names.parent(element)
        if not isinstance(mapping, cst.Dict):
            continue
        uses = _dict_uses(names, mapping)
        if uses and all(_saves(names, arg) for arg in uses):
            ref.api = "save_entry"


def _dict_uses(names, mapping: cst.Dict):
    """The call arguments `mapping` reaches: itself as one, or, assigned to a name bound once
    (`to_save = {...}`), every use of that name, each of which must be an argument."""
    parent = names.parent(mapping)
    if isinstance(parent, cst.Arg):
        return [parent]
    if not (isinstance(parent, cst.Assign) and parent.value is mapping and len(parent.targets) == 1):
        return []
    target = parent.targets[0].target
    if not isinstance(target, cst.Name):
        return []
    scope = names.scope_of(target)
    bindings = scope.bindings.get(target.value, [])
    if len(bindings) != 1:
        return []
    args = []
    for load in names.references(bindings[0]):
        arg = names.parent(load)
        if not (isinstance(arg, cst.Arg) and arg.value is load):
            return []
        args.append(arg)
    return args


def _saves(names, arg: cst.Arg) -> bool:
    """`arg` hands the dict to a checkpoint handler to save: `to_save=...`, or `Checkpoint`'s first argument."""
    call = names.parent(arg)
    if not isinstance(call, cst.Call):
        return False
    if arg.keyword is not None:
        return arg.keyword.value == "to_save"
    return call.args[0] is arg and bool(names.qualified_names(call.func) & _CHECKPOINT_CLASSES)


def plan_checkpoint_entry(planner, ref) -> None:
    """`{"amp": amp}` -> `{"amp": scaler}`."""
    planner.builder.replace(ref.node, planner.ctx.parse_expression(planner.access.expression(ref.node)))
    planner.handled.add(ref.node)
