"""AMP101 across files: `amp.scale_loss` in a function that receives apex's amp module from
another file of the run (main.py calls `amp.initialize` and `train(model, opt, amp)`).

The trainer's file never names apex, so the in-file plan (_amp_migration.py) cannot see it; the
project index (engine/project_index.py, "apex.amp across files") records who passes apex's amp
to which function. A top-level function taking it in one parameter takes the GradScaler there
(_passed_training.py, _passed_module_side.py) when every end migrates; otherwise, and for a
method, the site is reported (with `amp.master_params`/`state_dict`/`load_state_dict` on the same
parameter), naming the file the amp module comes from, and the code is left alone. A function that only this file's
own calls hand the module to (`main()` passes the `amp` it imported to `train(..., amp)`) is the
in-file migration's (_amp_refs.py follows the module into it), not this rule's. A trainer file
that imports apex's amp itself (`amp.initialize` in another file that passes it the optimizer)
is the split migration's (_cross_threading.py, engine/apex_threading.py).
"""

from __future__ import annotations

import ast
import dataclasses
import os

import libcst as cst

from ampmigrate.engine.apex_values import apex_state_params
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._state_load_guard import GUARD_NOTE, guard_state_load
from ampmigrate.rules.apex._state_params_elsewhere import group_problem
from ampmigrate.rules.apex._amp_refs import amp_usage
from ampmigrate.rules.apex.amp101_apex_amp import _REPLACEMENT as _ALL
from ampmigrate.rules.base import Rule

# The apex amp calls AMP101 migrates (amp.initialize stays with the file that imports apex).
_REPLACEMENT = {api: _ALL[api] for api in ("scale_loss", "master_params", "state_dict", "load_state_dict")}

_REASON = (
    "apex's amp module comes from {origin} (amp.initialize there): the GradScaler must be made there and "
    "passed here, an edit of the caller and this function that the fix does not make yet"
)


class ApexAmpPassedIn(Rule):
    code = "AMP101"
    triggers = (r"\.scale_loss\(", r"\.(?:load_)?state_dict\(", r"\.master_params\(")

    def applies_to_run(self, index) -> bool:
        """Only a run where some file passes apex's amp module to a call."""
        return index is not None and any(
            summary.apex_amp_passed_to or summary.apex_amp_args for summary in index.modules.values()
        )

    def screen(self, tree) -> bool:
        """A `.scale_loss(` call, or a parameter used only for amp's state (what the index records)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "scale_loss":
                return True
        return bool(apex_state_params(tree))

    @staticmethod
    def _state_params(ctx, index):
        """This file's parameters used only for amp's state (engine/apex_values.py), worked out
        only when some file hands apex's amp module to a function named like one of its own."""
        callees = index.apex_amp_callees(ctx.path)
        if not callees or not any(function.name.value in callees for _, function in _functions(ctx.module)):
            return {}
        try:
            return apex_state_params(ast.parse(ctx.text))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return {}

    def check(self, ctx) -> None:
        index = ctx.file.project_index
        if index is None:
            return
        followed = amp_usage(ctx.file).slots  # this file's own calls: the in-file migration's
        state = self._state_params(ctx, index)
        for owner, function in _functions(ctx.module):
            if function in followed:
                continue
            name = f"{owner}.{function.name.value}" if owner else function.name.value
            origin = index.apex_amp_passed_from(ctx.path, name)
            fix, reason = None, None
            if origin is not None:
                params = set(index.modules[os.path.abspath(ctx.path)].apex_amp_params[name])
                if not owner and len(params) == 1:
                    # a training function: it takes the GradScaler in apex's place (_passed_training.py)
                    from ampmigrate.rules.apex._passed_module_side import function_fix

                    fix, reason = function_fix(ctx.file, name, next(iter(params)))
            else:
                # A parameter used only for amp's state, that a call hands apex's amp module to.
                found = index.apex_amp_state_passed_from(ctx.path, name, state.get(name, []))
                if found is None:
                    continue
                origin, state_params = found
                params = set(state_params)
                fix, reason = _state_helper_fix(ctx, name, sorted(params), _amp_calls(function, params))
            where = index.relative(origin)
            for call, api in _amp_calls(function, params):
                ctx.report(
                    call.func,
                    f"`amp.{api}` (apex's amp passed in from {where}) was removed from apex in May 2025, "
                    f"so this no longer runs; use {_REPLACEMENT[api]}",
                    fix=fix,
                    no_fix_reason=None if fix is not None else reason or _REASON.format(origin=where),
                )


def _state_helper_fix(ctx, function: str, params, calls):
    """(the helper's side of the migration, None) when every file handing apex's module to
    `params` migrates too (_state_params_elsewhere.py), else (None, why not)."""
    index = ctx.file.project_index
    path = os.path.abspath(ctx.path)
    for param in params:
        problem = group_problem(ctx.file, (path, function, param))
        if problem is not None:
            return None, problem
    builder = ctx.fix(f"Take the GradScaler the callers pass in apex's place as `{'`, `'.join(params)}`")
    for call, api in calls:
        if api == "load_state_dict" and not _guarded(ctx.file, call):  # `p.state_dict()` reads a GradScaler alike
            try:
                guard_state_load(ctx.file, builder, call, ctx.file.code(call.func.value).strip(), f"{call.func.value.value}.load_state_dict")
            except Unfixable as exc:
                return None, str(exc)
            builder.message += f" ({GUARD_NOTE})"
    fix = builder.build()
    if not fix.changes:
        fix = dataclasses.replace(fix, elsewhere=True, message=fix.message + " (nothing to change here: the callers' fix passes it)")
    return fix, None


def _guarded(ctx, call: cst.Call) -> bool:
    """`p.load_state_dict(x)` already under `if "scale" in x:` (an earlier round's guard)."""
    names = ctx.names
    line = names.parent(names.parent(call))
    block = names.parent(line)
    owner = names.parent(block)
    if not (isinstance(owner, cst.If) and isinstance(owner.test, cst.Comparison) and len(call.args) == 1):
        return False
    test = owner.test
    return (
        isinstance(test.left, cst.SimpleString)
        and test.left.evaluated_value == "scale"
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.In)
        and ctx.code(test.comparisons[0].comparator).strip() == ctx.code(call.args[0].value).strip()
    )


def _functions(module: cst.Module):
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            yield "", statement
        elif isinstance(statement, cst.ClassDef):
            for item in statement.body.body:
                if isinstance(item, cst.FunctionDef):
                    yield statement.name.value, item


def _amp_calls(function: cst.FunctionDef, params: set):
    """(call, apex amp API) for each `param.<api>(...)` on a parameter holding apex's amp."""
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in _REPLACEMENT
                and isinstance(func.value, cst.Name)
                and func.value.value in params
            ):
                found.append((node, func.attr.value))

    function.body.visit(_Find())
    return found
