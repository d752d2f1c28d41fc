"""The GradScaler handed to an input gradient's helper in another file (engine/apex_input_gradients.py).

The training script's side is the in-file planner (`_amp_migration._Planner`): it migrates its
own steps, and each call handing the optimizer `amp.initialize` returned to such a helper gets
`scaler=<the scaler there>` (`gradient_calls`, then `_checkpoint_threading.pass_scaler`). The
helper's side is the split migration's step side (`_cross_threading._StepSide`): the helper takes
`scaler=None`, scales with `scaler.scale(loss).backward()` and steps nothing (`is_input_gradient`).

Both sides ask `decide` (the same index facts) and, where they verify, plan the others from the
bytes the index read (`_cross_threading.group_check`): all migrate, or none does.
"""

from __future__ import annotations

import os
from typing import List, Set, Tuple

import libcst as cst

from ampmigrate.engine.apex_threading import Decision, decide, step_spellings
from ampmigrate.rules.apex._amp_common import Unfixable


def is_input_gradient(planner, function_name: str) -> bool:
    """`function_name` is an input gradient's helper of the planner's file (it never steps)."""
    index = planner.ctx.project_index
    facts = index.modules.get(os.path.abspath(planner.ctx.path)) if index is not None else None
    return facts is not None and function_name in facts.apex_gradient_functions


def gradient_calls(planner, optimizers: Set[str]) -> List[Tuple[cst.Call, Tuple[str, str], Decision]]:
    """The calls of the planner's file handing one of `optimizers` (the names `amp.initialize`
    bound) to a function of another file that scales a loss with apex: each an input gradient's
    helper that migrates with this file, with its decision. Any other such call stops the plan:
    without `amp.initialize` that function's `amp.scale_loss` raises, and a file that scales its
    own losses is not threaded to a training function elsewhere."""
    from ampmigrate.rules.apex._amp_migration import _dotted
    from ampmigrate.rules.apex._cross_threading import group_check

    index = planner.ctx.project_index
    if index is None or not optimizers:
        return []
    spelled = step_spellings(index, os.path.abspath(planner.ctx.path))
    if not spelled:
        return []
    found: List[Tuple[cst.Call, Tuple[str, str], Decision]] = []
    for call in planner.names.nodes_of_type(cst.Call):
        target = spelled.get(_dotted(call.func))
        if target is None or not any(isinstance(arg.value, cst.Name) and arg.value.value in optimizers for arg in call.args):
            continue
        other, function = target
        where = f"line {planner._line(call)} hands the optimizer to `{function}()` of {index.relative(other)}, which scales a loss with apex's amp"
        if function not in index.modules[other].apex_gradient_functions:
            problem = index.modules[other].apex_step_functions[function][3]
            raise Unfixable(
                f"{where}: it must take the GradScaler made here, and files that scale a loss themselves are not "
                f"threaded to another file's training function{f' (there: {problem})' if problem else ''}"
            )
        decision = decide(index, other, function)
        if not decision.migrate:
            raise Unfixable(f"{where}, and cannot take the GradScaler made here: {decision.reason}")
        if getattr(planner, "verify", True):
            problem, unsafe = group_check(planner.ctx, other, function)
            if problem is not None:
                raise Unfixable(f"{where}, and cannot take the GradScaler made here: {problem}")
            planner.unsafe.extend(u for u in unsafe if u not in planner.unsafe)
        found.append((call, (os.path.abspath(other), function), decision))
    return found
