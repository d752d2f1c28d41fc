"""AMP308: a checkpoint saves the optimizer's state but not the GradScaler's.

The loss scale is training state like the optimizer's moments: it has grown or backed off to fit
the model's gradients. A run resumed without it restarts at the initial scale (2**16 by default),
typically overflows and skips steps until it has backed off again, and its growth schedule starts
over. Informational: the checkpoint format is the user's to change.
"""

from __future__ import annotations

from typing import List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.scaler_protocol import optimizer_argument, optimizer_key
from ampmigrate.analysis.scalers import escapes, family, find_scalers
from ampmigrate.rules.base import Rule
from ampmigrate.rules.grad_scaler._shared import TRIGGERS
from ampmigrate.rules.grad_scaler._shared import SCALER_PREFIXES


class CheckpointWithoutScalerState(Rule):
    code = "AMP308"
    triggers = TRIGGERS
    qualified_prefixes = SCALER_PREFIXES

    def check(self, ctx) -> None:
        names = ctx.names
        seen: List[int] = []
        reported: Set[cst.CSTNode] = set()
        state_dict_calls: Optional[List[Tuple[cst.Call, object]]] = None  # (call, its receiver's key), found once
        for scaler in find_scalers(ctx.file):
            members = family(scaler)
            if id(members[0]) in seen:
                continue
            seen.extend(id(m) for m in members)
            if scaler.disabled or not any(m.calls("scale") for m in members):
                continue
            if any(m.calls("state_dict") for m in members) or any(escapes(names, m) for m in members):
                continue  # saved, or handed to code that may save it
            arguments = [optimizer_argument(u.call) for m in members for u in m.uses if u.method in ("step", "unscale_")]
            optimizers = {optimizer_key(names, arg) for arg in arguments if arg is not None}
            optimizers = {key for key in optimizers if key.stable}
            if not optimizers:
                continue
            display = members[0].display
            self._savers_elsewhere(ctx, optimizers, display, reported)
            if state_dict_calls is None:
                state_dict_calls = [(call, optimizer_key(names, call.func.value)) for call in _state_dict_calls(names)]
            for call, receiver_key in state_dict_calls:
                if call in reported or receiver_key not in optimizers:
                    continue
                reported.add(call)
                ctx.report(
                    call.func,
                    f"`{ctx.code(call)}` is saved but the scaler's state is not: a resumed run restarts the loss scale "
                    f"at its initial value and may skip steps until it backs off; save `{display}.state_dict()` "
                    f"too and restore it with `{display}.load_state_dict(...)`",
                )

    def _savers_elsewhere(self, ctx, optimizers, display: str, reported: Set[cst.CSTNode]) -> None:
        """`save_checkpoint(model, optimizer, epoch)`, a helper of another file of the run that
        saves its optimizer parameter's `.state_dict()` and no scaler's (the project index)."""
        index = ctx.file.project_index
        if index is None:
            return
        names = ctx.names
        for call in names.nodes_of_type(cst.Call):
            if call in reported or not isinstance(call.func, (cst.Name, cst.Attribute)):
                continue
            record = next(filter(None, (index.checkpoint_saver(q, ctx.file.path) for q in sorted(names.qualified_names(call.func)))), None)
            if record is None:
                continue
            path, positional, saved = record
            for position, arg in enumerate(call.args):
                if arg.star:
                    break
                param = arg.keyword.value if arg.keyword is not None else (positional[position] if position < len(positional) else None)
                if param in saved and optimizer_key(names, arg.value) in optimizers:
                    reported.add(call)
                    ctx.report(
                        call.func,
                        f"`{ctx.code(call.func).strip()}(...)` ({index.relative(path)}) saves the state of "
                        f"`{ctx.code(arg.value).strip()}` but not the scaler's: a resumed run restarts the loss scale "
                        f"at its initial value and may skip steps until it backs off; save `{display}.state_dict()` "
                        f"too and restore it with `{display}.load_state_dict(...)`",
                    )
                    break


def _state_dict_calls(names) -> List[cst.Call]:
    return [
        node
        for node in names.nodes_of_type(cst.Call)
        if isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "state_dict"
        and not node.args
    ]
