"""AMP305: `scaler.update()` on iterations that do not step (every micro-step of accumulation).

The docs: the scale must stay constant across the micro-batches of one effective batch, and
`update()` belongs after the last micro-batch's `step`. An `update()` on a micro-step that
neither stepped nor unscaled asserts ("No inf checks were recorded prior to update."); one that
runs while gradients are still accumulating changes the scale between micro-batches, so the
accumulated gradient mixes two scales. The fix moves the `update()` right after the step in the
stepping branch when that is unambiguous: the `update()` is a line of its own that directly
follows the `if` whose body steps (statements without protocol calls in between).
"""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ampmigrate.analysis import statements
from ampmigrate.analysis.scaler_protocol import STEP, UPDATE, UnitAnalysis, analyses
from ampmigrate.rules.grad_scaler._shared import (
    ProtocolRule,
    call_statement,
    callee,
    direct_statements,
    moved,
    remove_statement,
)


class UpdateWithoutStep(ProtocolRule):
    code = "AMP305"

    def check(self, ctx) -> None:
        for unit in analyses(ctx.file):
            nodes = list(dict.fromkeys([*unit.updates_without_step, *unit.updates_during_accumulation]))
            for call in nodes:
                message = (
                    f"`{ctx.code(call)}` runs on iterations that do not step: the scale changes between the "
                    "micro-batches of one step (or the update asserts that no inf checks were recorded); "
                    "update once, after the step"
                )
                plan, reason = _move_plan(ctx, unit, call)
                if plan is None:
                    ctx.report(callee(call), message, no_fix_reason=reason)
                    continue
                statement, after = plan
                fix = ctx.fix("Move the `update()` right after the step, into the branch that steps")
                remove_statement(fix, ctx.names, statement)
                fix.insert_after(after, moved(statement))
                ctx.report(callee(call), message, fix=fix.build())


def _move_plan(ctx, unit: UnitAnalysis, call: cst.Call) -> Tuple[Optional[Tuple[cst.CSTNode, cst.CSTNode]], str]:
    names = ctx.names
    reader = unit.events
    statement = call_statement(names, call)
    if statement is None:
        return None, "the `update()` shares its statement with other code"
    block, index = statements.block_of(names, statement)
    for earlier in reversed(block[:index]):
        if not reader.of(earlier):
            continue
        last_step = _last_step_line(reader, earlier)
        if last_step is None:
            return None, "the closest statement before it that uses the scaler is not the `if` that steps"
        return (statement, last_step), ""
    return None, "no `if` that steps comes before it in the same block"


def _last_step_line(reader, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    """If `statement` is an `if` (without else) whose body steps on lines of its own and never
    updates: the last of those step lines."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return None
    body = direct_statements(statement.body)
    if any(e.kind == UPDATE for child in body for e in reader.of(child)):
        return None
    steps = [
        child
        for child in body
        if isinstance(child, cst.SimpleStatementLine) and any(e.kind == STEP for e in reader.of(child))
    ]
    if not steps or any(e.kind == STEP for child in body if child not in steps for e in reader.of(child)):
        return None
    return steps[-1]
