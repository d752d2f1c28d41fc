"""apex's amp module handed to a checkpoint helper of another file that only saves or restores
its state (deepspeech.pytorch's `state.track_amp_state(amp)` and `DeepSpeech.serialize(...,
amp=amp)`, neural_sp's `load_checkpoint(path, amp=amp)`).

The helper (`def track_amp_state(self, amp): self.amp_state = amp.state_dict()`) uses its
parameter only as `p.state_dict()`, `p.load_state_dict(x)` and in `p is None` tests
(engine/apex_values.py `function_state_params`); the project index names the one function of an
imported file a call reaches (`ProjectIndex.apex_state_param_target`). A GradScaler has both
methods, so the migration passes the scaler in apex's place:

- the caller (the in-file plan, api "state_pass"): `track_amp_state(amp)` -> `track_amp_state(scaler)`;
- the helper (rules/apex/cross_module.py): `p.state_dict()` stays, `p.load_state_dict(x)` loads
  only a state with GradScaler's layout (_state_load_guard.py: apex's checkpoints resume with the
  scaler at its initial scale).

Both ends must migrate together: the helper's `load_state_dict` would reject apex's module after
the guard, and apex's layout without it. So each end plans the other from the bytes the index
read (_other_files.py): every file handing apex's module to that parameter migrates, and the
helper uses it in no way the rewrite cannot follow (`p.master_params(...)`: no GradScaler
counterpart), or neither end changes.
"""

from __future__ import annotations

import ast
import os
from typing import List, Optional, Tuple

import libcst as cst

from ampmigrate.engine.caller_uses import source_tree
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import dotted
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._other_files import group_memo, unmigrated_caller
from ampmigrate.rules.apex._state_loader_args import argument_slot, module_arguments

Target = Tuple[str, str, str]  # (the helper's file, "Class.method" or function, the parameter)


def mark_state_param_args(ctx: FileContext, refs) -> None:
    """Module references passed to such a helper become api "state_pass" (`ref.elsewhere`: the
    target)."""
    index = ctx.project_index
    if index is None:
        return
    for ref, arg, call in module_arguments(ctx.names, refs):
        callee = dotted(call.func)
        slot = argument_slot(call, arg)
        if callee is None or slot is None or _defined_here(ctx, call.func):
            continue
        target = index.apex_state_param_target(ctx.path, callee, *slot)
        if target is not None:
            ref.api, ref.elsewhere = "state_pass", target


def plan_state_param_arg(planner, ref) -> None:
    """`helper(..., amp)` -> `helper(..., scaler)`, once both ends are known to migrate."""
    ctx = planner.ctx
    problem = group_problem(ctx, ref.elsewhere, caller=os.path.abspath(ctx.path))
    if problem is not None:
        raise Unfixable(problem)
    names = planner.names
    arg = names.parent(ref.node)
    call = names.parent(arg)
    scaler = planner.access.expression(call)
    planner.builder.replace(ref.node, ctx.parse_expression(scaler))
    planner.handled.add(ref.node)
    path, function, param = ref.elsewhere
    planner._note(
        f"the GradScaler takes apex's place as `{param}` of `{function}()` ({ctx.project_index.relative(path)}), "
        "which only saves or restores its state"
    )


def group_problem(ctx: FileContext, target: Target, caller: Optional[str] = None) -> Optional[str]:
    """Why the helper and the files handing it apex's module cannot all migrate (None: they
    can). One answer per target for every side (`caller`, the file asking, is planned too, from
    the index's bytes: its own plan asks again and is answered as if the group migrated)."""
    index = ctx.project_index

    def compute() -> Optional[str]:
        return helper_problem(index, target) or unmigrated_caller(ctx, callers(index, target), target[1], None)

    return group_memo(ctx, "apex.state_params_elsewhere", target, compute)


def helper_problem(index, target: Target) -> Optional[str]:
    """Why the helper's uses of the parameter cannot take a GradScaler (None: they can)."""
    path, function, param = target
    node = _function_node(index, path, function)
    where = f"`{function}()` ({index.relative(path)})"
    if node is None:
        return f"{where} could not be read again"
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        receiver = call.func.value
        if not (isinstance(receiver, ast.Name) and receiver.id == param):
            continue
        if call.func.attr == "master_params":
            return f"{where} reads `{param}.master_params(...)`, which a GradScaler has no counterpart for"
        if call.func.attr == "load_state_dict" and (len(call.args) != 1 or call.keywords):
            return f"{where} calls `{param}.load_state_dict` with other than one state, which the fix cannot guard"
    return None


def callers(index, target: Target) -> List[str]:
    """The files of the run (other than the helper's) whose calls hand apex's amp module to the
    parameter, as the index matches them (`ProjectIndex.apex_state_param_target`)."""
    path, function, param = target
    found = []
    for other in sorted(index.modules):
        if other == path:
            continue
        for callee, _, position, keyword in index.modules[other].apex_amp_args:
            if index.apex_state_param_target(other, callee, position, keyword) == target:
                found.append(other)
                break
    return found


def _function_node(index, path: str, function: str) -> Optional[ast.FunctionDef]:
    tree = source_tree(index, path)
    if tree is None:
        return None
    owner, _, name = function.rpartition(".")
    for statement in tree.body:
        if not owner and isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            return statement
        if owner and isinstance(statement, ast.ClassDef) and statement.name == owner:
            for item in statement.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    return None


def _defined_here(ctx: FileContext, func: cst.BaseExpression) -> bool:
    """The callee's first name is a function or class of this file (the in-file follow's)."""
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    return isinstance(root, cst.Name) and any(b.kind in ("def", "class") for b in ctx.names.bindings_of(root))
