"""AMP302: `scaler.unscale_(opt)` on iterations that do not step, or twice before `update()`.

In an accumulation loop, `unscale_` on every micro-step divides the gradients accumulated so far by
the scale; the next micro-batch then adds *scaled* gradients on top of them (and, without an
`update()` in between, the second `unscale_` raises "unscale_() has already been called on this
optimizer since the last update()"). `unscale_` belongs in the stepping branch, right before the
clip. The fix moves it there when the shape is unambiguous: the `unscale_` is a statement of its
own, directly followed (nothing but statements without protocol calls in between) by the `if`
whose body steps that optimizer.
"""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ampmigrate.analysis import statements
from ampmigrate.analysis.scaler_protocol import (
    STEP,
    UNSCALE,
    Event,
    UnitAnalysis,
    analyses,
)
from ampmigrate.rules.grad_scaler._shared import (
    ProtocolRule,
    call_statement,
    callee,
    direct_statements,
    moved,
    remove_statement,
)


class UnscaleWithoutStep(ProtocolRule):
    code = "AMP302"

    def check(self, ctx) -> None:
        for unit in analyses(ctx.file):
            reported = set()
            for table, kind in (
                (unit.unscales_before_accumulation, "accumulate"),
                (unit.repeat_unscales, "repeat"),
                (unit.double_unscales, "twice"),
            ):
                for node in table:
                    if node in reported:
                        continue
                    reported.add(node)
                    self._report(ctx, unit, node, kind)

    def _report(self, ctx, unit: UnitAnalysis, call: cst.Call, kind: str) -> None:
        event = next(e for e in unit.events.of(call) if e.kind == UNSCALE and e.node is call)
        text = ctx.code(call)
        if kind == "twice":
            message = (
                f"`{text}` runs after another `unscale_` of the same optimizer with no `update()` in between: "
                "it raises RuntimeError (unscale_() has already been called on this optimizer since the last update())"
            )
            ctx.report(callee(call), message, no_fix_reason="remove one of the two calls")
            return
        message = (
            f"`{text}` runs on iterations that do not step: the next micro-batch adds scaled gradients to "
            "gradients already unscaled, and a second `unscale_` before `update()` raises RuntimeError; "
            "unscale only in the iteration that steps"
        )
        plan, reason = _move_plan(ctx, unit, event)
        if plan is None:
            ctx.report(callee(call), message, no_fix_reason=reason)
            return
        statement, before = plan
        fix = ctx.fix("Move the `unscale_` into the branch that steps the optimizer")
        remove_statement(fix, ctx.names, statement, keep_clear=_owning_if(ctx.names, before))
        fix.insert_before(before, moved(statement))
        ctx.report(callee(call), message, fix=fix.build())


def _move_plan(ctx, unit: UnitAnalysis, event: Event) -> Tuple[Optional[Tuple[cst.CSTNode, cst.CSTNode]], str]:
    """((the `unscale_` line, the statement of the stepping branch to put it before), "") or (None, why)."""
    names = ctx.names
    reader = unit.events
    statement = call_statement(names, event.node)
    if statement is None:
        return None, "the `unscale_` shares its statement with other code"
    block, index = statements.block_of(names, statement)
    for later in block[index + 1 :]:
        events = reader.of(later)
        if not events:
            continue
        branch = _stepping_branch(reader, later, event)
        if branch is None:
            return None, "the next statement that touches the gradients is not the `if` that steps the optimizer"
        return (statement, branch), ""
    return None, "no `if` that steps the optimizer follows it in the same block"


def _stepping_branch(reader, statement: cst.CSTNode, unscale: Event) -> Optional[cst.CSTNode]:
    """If `statement` is an `if` (without else) whose body steps the optimizer on a line of its
    own: the first statement of that body with a protocol call or a clip (the `unscale_` goes
    right before it)."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return None
    body = direct_statements(statement.body)
    optimizer = unscale.optimizer
    if not any(
        isinstance(child, cst.SimpleStatementLine)
        and any(e.kind == STEP and e.optimizer == optimizer for e in reader.of(child))
        for child in body
    ):
        return None
    if any(e.kind == UNSCALE and e.optimizer == optimizer for child in body for e in reader.of(child)):
        return None  # already unscaled in there: moving would unscale twice
    return next((child for child in body if reader.of(child)), None)


def _owning_if(names, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    return names.enclosing(statement, (cst.If,))
