"""AMP303: `optimizer.step()` after `scaler.scale(loss).backward()`, bypassing the scaler.

The gradients are still multiplied by the loss scale (2**16 at first), so the update is that many
times too large, and steps with inf/NaN gradients are applied instead of skipped. The fix calls
`scaler.step(optimizer)` instead, and adds `scaler.update()` after it when the function has no
scaler step/update of its own (otherwise AMP304 places the update).
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.analysis.scaler_protocol import SCALED_BACKWARD, STEP, UPDATE, UnitAnalysis, analyses
from ampmigrate.rules.grad_scaler._shared import call_statement, callee, line_of, simple_expression
from ampmigrate.rules.grad_scaler._shared import ProtocolRule


class OptimizerStepBypassesScaler(ProtocolRule):
    code = "AMP303"

    def check(self, ctx) -> None:
        for unit in analyses(ctx.file):
            if not unit.plain_steps or _reads_scale(ctx, unit):
                continue
            for call, event in unit.plain_steps.items():
                self._report(ctx, unit, call, event)

    def _report(self, ctx, unit: UnitAnalysis, call: cst.Call, event) -> None:
        events = unit.events.all_events()
        receiver = next(e.receiver for e in events if e.kind == SCALED_BACKWARD and e.receiver is not None)
        scaler = ctx.code(receiver)
        optimizer = ctx.code(event.optimizer_expr)
        message = (
            f"`{ctx.code(call)}` applies gradients from `{scaler}.scale(...).backward()` that are still multiplied "
            f"by the loss scale, and never skips inf/NaN steps; use `{scaler}.step({optimizer})`"
        )
        statement = call_statement(ctx.names, call)
        reason = None
        if call.args:
            reason = "`step` is given arguments (a closure is not supported by `scaler.step`)"
        elif statement is None:
            reason = "the step is part of a larger statement"
        elif call in unit.plain_steps_mixed:
            reason = "on other paths the backward is not scaled (the scaler may be off or None there)"
        elif not simple_expression(event.optimizer_expr) or not simple_expression(receiver):
            reason = "the optimizer or the scaler is not a plain name"
        if reason is not None:
            ctx.report(callee(call), message, no_fix_reason=reason)
            return
        add_update = not any(e.kind in (STEP, UPDATE) for e in events)
        new_call = cst.Call(
            func=ctx.parse_expression(f"{scaler}.step"),
            args=[cst.Arg(event.optimizer_expr)],
        )
        expr = statement.body[0]
        fix = ctx.fix(f"Use `{scaler}.step({optimizer})`" + (f" and `{scaler}.update()`" if add_update else ""))
        fix.replace(statement, statement.with_changes(body=[expr.with_changes(value=new_call)]))
        if add_update:
            fix.insert_after(statement, line_of(ctx, f"{scaler}.update()"))
        ctx.report(callee(call), message, fix=fix.build())


def _reads_scale(ctx, unit: UnitAnalysis) -> bool:
    """`scaler.get_scale()` or `scaler._scale` here: the gradients may be unscaled by hand."""
    owner = unit.owner
    for scaler in unit.scalers:
        for use in scaler.uses:
            if use.method == "get_scale" and ctx.names.enclosing(use.call, (cst.FunctionDef,)) in (owner, None):
                return True
        for ref in scaler.other_refs:
            if isinstance(ctx.names.parent(ref), cst.Attribute):
                return True
    return False
