"""apex's amp module handed to a checkpoint loader that restores its keyword arguments.

SwAV's lineage resumes with `restart_from_checkpoint(path, ..., optimizer=optimizer,
amp=apex.amp)`: the loader (engine/state_loaders.py) calls `value.load_state_dict(ckpt[key])`
for each keyword whose key the checkpoint has, and the training loop saves
`save_dict["amp"] = apex.amp.state_dict()`. With torch.amp the GradScaler takes the module's
place, under a new key on both sides, `scaler`: a checkpoint apex saved has no such entry, so
the loader skips it (its own "failed to load" path) and the scaler resumes at its initial scale,
as `amp.load_state_dict` of an apex state is guarded elsewhere; `GradScaler.load_state_dict` of
apex's `{"loss_scaler0": ...}` would raise KeyError instead.

What the rewrite needs, or it refuses with the reason: the argument is a keyword argument of a
call whose callee the project index records as such a loader; the file saves the amp state only
as `<dict>["<keyword>"] = amp.state_dict()` or `{"<keyword>": amp.state_dict()}` entries; the
new key is free (no string `"scaler"` in the file, no `scaler=` keyword in the call).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from ampmigrate.engine.context import FileContext
from ampmigrate.rules.apex._amp_common import Unfixable

NEW_KEY = "scaler"


def mark_state_loader_args(ctx: FileContext, refs) -> None:
    """Module references passed by keyword to a state loader become api "state_arg"."""
    index = ctx.project_index
    if index is None:
        return
    names = ctx.names
    for ref, arg, call in module_arguments(names, refs):
        if arg.keyword is None:
            continue
        if not isinstance(call.func, (cst.Name, cst.Attribute)):
            continue
        if any(index.state_loader(q, ctx.path) for q in sorted(names.qualified_names(call.func))):
            ref.api = "state_arg"


def module_arguments(names, refs):
    """(ref, its `cst.Arg`, the call) for each reference to apex's amp module not yet claimed
    (api None) that is itself an argument of a call (not `*amp`)."""
    for ref in refs:
        if ref.api is not None:
            continue
        arg = names.parent(ref.node)
        call = names.parent(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(call, cst.Call) and arg.value is ref.node and not arg.star:
            yield ref, arg, call


def argument_slot(call: cst.Call, arg: cst.Arg):
    """(position among the positional arguments or -1, keyword or "") of `arg` in `call`; None
    after a `*args` (its position is not known)."""
    if arg.keyword is not None:
        return -1, arg.keyword.value
    if any(a.star for a in call.args[: call.args.index(arg)]):
        return None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional.index(arg), ""


def plan_state_loader_arg(planner, ref) -> None:
    """`loader(..., amp=apex.amp)` -> `loader(..., scaler=scaler)`, and each save of the amp
    state under the keyword's key moves to the new key."""
    names = planner.names
    arg = names.parent(ref.node)
    call = names.parent(arg)
    keyword = arg.keyword.value
    saves = _saves(planner, keyword)
    if not saves:
        raise Unfixable(
            f"`{planner.ctx.code(call.func).strip()}(..., {keyword}=...)` at line {planner._line(call)} restores apex's "
            f"state from the checkpoint entry `{keyword}`, which this file does not save as `amp.state_dict()`: the "
            "GradScaler's entry cannot be matched to it"
        )
    if any(a.keyword is not None and a.keyword.value == NEW_KEY for a in call.args) or _string_used(planner, NEW_KEY):
        raise Unfixable(f"the checkpoint key `{NEW_KEY}` for the GradScaler's state is already used in this file")
    scaler = planner.access.expression(call)
    planner.builder.replace(
        arg, arg.with_changes(keyword=cst.Name(NEW_KEY), value=planner.ctx.parse_expression(scaler))
    )
    for key in saves:
        planner.builder.replace(key, planner.ctx.string(NEW_KEY))
    planner.handled.add(ref.node)
    planner._note(
        f"the GradScaler's state is checkpointed under `{NEW_KEY}` (apex's was `{keyword}`) and restored by "
        f"`{planner.ctx.code(call.func).strip()}(..., {NEW_KEY}={scaler})`: a checkpoint saved by apex resumes with "
        "the scaler at its initial scale"
    )


def _saves(planner, keyword: str) -> List[cst.SimpleString]:
    """The key strings of every `amp.state_dict()` save of the file, when each is stored under
    `keyword` (a subscript assignment or a dict entry); [] when any is not."""
    keys: List[cst.SimpleString] = []
    for ref in planner.refs:
        if ref.api != "state_dict":
            continue
        key = _save_key(planner, ref.call)
        if key is None or key.evaluated_value != keyword:
            return []
        keys.append(key)
    return keys


def _save_key(planner, call: Optional[cst.Call]) -> Optional[cst.SimpleString]:
    if call is None:
        return None
    names = planner.names
    parent = names.parent(call)
    if isinstance(parent, cst.DictElement) and parent.value is call and isinstance(parent.key, cst.SimpleString):
        return parent.key
    if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
        target = parent.targets[0].target
        if isinstance(target, cst.Subscript) and len(target.slice) == 1:
            index = target.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
                return index.value
    return None


def _string_used(planner, value: str) -> bool:
    return any(
        isinstance(node, cst.SimpleString) and node.evaluated_value == value
        for node in planner.names.nodes_of_type(cst.SimpleString)
    )
