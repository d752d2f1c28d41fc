"""apex's amp module handed to a training function of another file (stereo-transformer's
`train_one_epoch(model, ..., max_norm, amp)` of utilities/train.py, called from main.py after
`amp.initialize`, with `amp = None` where fp16 is off).

The function calls `p.scale_loss(...)` on its parameter (`p.master_params(...)` too, and tests
`p is not None`); the project index names the one top-level function of an imported file that a
call's argument reaches (`ProjectIndex.apex_train_param_target`). The migration is the one the
in-file plan makes when both are in one file (_amp_refs.py follows the module into the function):

- the caller (the in-file plan, api "train_pass"): the GradScaler made where `amp.initialize` was
  (disabled where `amp` was None) goes in apex's place, `train_one_epoch(..., scaler)`;
- the function (rules/apex/_passed_module_side.py): the parameter is renamed `scaler`, the scaled
  backward and the step become the GradScaler's, the forward pass goes under autocast enabled as
  the scaler is, and `p is not None` becomes `scaler.is_enabled()`.

That last rewrite holds only where every call passes the scaler: so every call of the function in
the run must hand it apex's module in that parameter (a call without it would now pass None), and
every file doing so must migrate with it. Each end plans the others from the bytes the index read
(_other_files.py) and migrates only when all do.
"""

from __future__ import annotations

import ast
import os
from typing import List, Optional, Tuple

import libcst as cst

from ampmigrate.engine.caller_uses import source_tree, uses
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import dotted
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._other_files import group_memo, text_as_indexed, unmigrated_caller
from ampmigrate.rules.apex._state_loader_args import argument_slot, module_arguments

Target = Tuple[str, str, str]  # (the function's file, its name, the parameter)


def mark_train_param_args(ctx: FileContext, refs) -> None:
    """Module references passed to such a function become api "train_pass" (`ref.elsewhere`:
    the target)."""
    index = ctx.project_index
    if index is None:
        return
    for ref, arg, call in module_arguments(ctx.names, refs):  # (those not taken already)
        callee = dotted(call.func)
        slot = argument_slot(call, arg)
        if callee is None or slot is None:
            continue
        target = index.apex_train_param_target(ctx.path, callee, *slot)
        if target is not None:
            ref.api, ref.elsewhere = "train_pass", target


def plan_train_param_arg(planner, ref) -> None:
    """`train(..., amp)` -> `train(..., scaler)`, once every end is known to migrate."""
    ctx = planner.ctx
    problem = group_problem(ctx, ref.elsewhere, caller=os.path.abspath(ctx.path))
    if problem is not None:
        raise Unfixable(problem)
    call = planner.names.parent(planner.names.parent(ref.node))
    planner.builder.replace(ref.node, ctx.parse_expression(planner.access.expression(call)))
    planner.handled.add(ref.node)
    path, function, param = ref.elsewhere
    planner._note(
        f"the GradScaler takes apex's place as `{param}` of `{function}()` ({ctx.project_index.relative(path)}), "
        "which scales the loss with it"
    )


def group_problem(ctx: FileContext, target: Target, caller: Optional[str] = None) -> Optional[str]:
    """Why the function and the files handing it apex's module cannot all migrate (None: they
    can). One answer per target for every side (`caller`, the file asking, is planned too, from
    the index's bytes: its own plan asks again and is answered as if the group migrated)."""
    index = ctx.project_index
    path, function, _ = target

    def compute() -> Optional[str]:
        return (
            calls_problem(index, target)
            or _side_problem(ctx, target)
            or unmigrated_caller(ctx, callers(index, target), function, None)
        )

    return group_memo(ctx, "apex.passed_training", target, compute)


def callers(index, target: Target) -> List[str]:
    """The files of the run whose calls hand apex's amp module to the function's parameter."""
    path, function, param = target
    found = []
    for other in index.importers_of(path):
        for callee, _, position, keyword in index.modules[other].apex_amp_args:
            if index.apex_train_param_target(other, callee, position, keyword) == target:
                found.append(other)
                break
    return sorted(found)


def calls_problem(index, target: Target) -> Optional[str]:
    """Why a use of the function in the run may not hand it apex's module in that parameter
    (None: every use is a call that does): the function's own file names it nowhere else, and
    in each file importing it every use is a call matched to apex's module by the index."""
    path, function, param = target
    where = f"`{function}()` ({index.relative(path)})"
    tree = source_tree(index, path)
    if tree is None:
        return f"{where} could not be read again"
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == function and isinstance(n.ctx, ast.Load)]
    if loads:
        return f"{where} is also used in its own file (line {loads[0].lineno}), where no GradScaler is made"
    for other in index.importers_of(path):
        found = uses(index, other, path, function)
        if found is None:
            return f"{index.relative(other)} could not be read again"
        if not found.calls and not found.other:
            continue
        if found.other or found.escapes or found.rebound or found.shadowed:
            return f"{index.relative(other)} uses {where} otherwise than by calling it"
        passing = {
            line
            for callee, line, position, keyword in index.modules[other].apex_amp_args
            if index.apex_train_param_target(other, callee, position, keyword) == target
        }
        for call in found.calls:
            if call.line not in passing:
                return (
                    f"{index.relative(other)} calls {where} at line {call.line} without apex's amp module in "
                    f"`{param}` (it would get no GradScaler)"
                )
    return None


def _side_problem(ctx: FileContext, target: Target) -> Optional[str]:
    """Why the function's own migration (the parameter taking a GradScaler) finds no fix."""
    from ampmigrate.rules.apex._passed_module_side import plan_function

    index = ctx.project_index
    path, function, param = target
    text = text_as_indexed(index, path)
    if text is None:
        return f"{index.relative(path)} could not be read again"
    try:
        module = cst.parse_module(text)
    except (cst.ParserSyntaxError, RecursionError):
        return f"{index.relative(path)} does not parse"
    other = FileContext(path, text, module, ctx.settings)
    other.project_index = index
    other.imported_elsewhere = frozenset(index.imported_from(path))
    other.imports_scanned = ctx.imports_scanned
    reason, unsafe = plan_function(other, function, param, verify=False)
    if reason is not None:
        return f"`{function}()` ({index.relative(path)}) cannot take the GradScaler: {reason}"
    if unsafe and not ctx.settings.unsafe_fixes:
        return f"`{function}()` ({index.relative(path)}): its fix is unsafe: {unsafe[0]}"
    return None
