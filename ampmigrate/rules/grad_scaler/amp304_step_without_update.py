"""AMP304: `scaler.step(...)` with no `scaler.update()` after it in the iteration.

Without `update()` the scale never adapts (no back-off after an overflow, no growth), and the next
`scaler.step(opt)` raises "step() has already been called since the last update()". Reported where
a step can run again before any update (a loop), and for a scaler whose whole life is in this
file when nothing ever calls its `update()`. The fix adds `scaler.update()` after the last step of
the function when all its steps are lines of one block (the docs: one update after all steps).
"""

from __future__ import annotations

from typing import List

from ampmigrate.analysis import statements
from ampmigrate.analysis.scaler_protocol import (
    STEP,
    UPDATE,
    Event,
    UnitAnalysis,
    analyses,
)
from ampmigrate.analysis.scalers import escapes, family
from ampmigrate.rules.grad_scaler._shared import (
    ProtocolRule,
    call_statement,
    callee,
    line_of,
    simple_expression,
)


class StepWithoutUpdate(ProtocolRule):
    code = "AMP304"

    def check(self, ctx) -> None:
        for unit in analyses(ctx.file):
            steps = [e for e in unit.events.all_events() if e.kind == STEP]
            flagged: List[Event] = [e for e in steps if e.node in unit.repeat_steps]
            if _never_updated(ctx, unit):
                flagged = steps
            if not flagged:
                continue
            fix = self._fix(ctx, unit, steps)
            for event in flagged:
                scaler = ctx.code(event.receiver)
                message = (
                    f"`{ctx.code(event.node)}` is not followed by `{scaler}.update()` in the iteration: the loss scale "
                    "never adapts, and the next `step` raises RuntimeError (step() has already been called since the last update())"
                )
                if isinstance(fix, str):
                    ctx.report(callee(event.node), message, no_fix_reason=fix)
                else:
                    ctx.report(callee(event.node), message, fix=fix)

    def _fix(self, ctx, unit: UnitAnalysis, steps: List[Event]):
        """One fix for the function (shared by its findings), or why there is none."""
        if any(e.kind == UPDATE for e in unit.events.all_events()):
            return "the function updates the scaler on some paths; put the missing `update()` where the step happens"
        lines = [call_statement(ctx.names, e.node) for e in steps]
        if any(line is None for line in lines):
            return "a step is part of a larger statement"
        blocks = {id(statements.block_of(ctx.names, line)[0]) for line in lines}
        if len(blocks) != 1:
            return "the steps are in different blocks"
        if not simple_expression(steps[0].receiver):
            return "the scaler is not a plain name"
        block, _ = statements.block_of(ctx.names, lines[0])
        last = max(lines, key=lambda line: list(block).index(line))
        scaler = ctx.code(steps[0].receiver)
        fix = ctx.fix(f"Add `{scaler}.update()` after the last step")
        fix.insert_after(last, line_of(ctx, f"{scaler}.update()"))
        return fix.build()


def _never_updated(ctx, unit: UnitAnalysis) -> bool:
    """The scaler is made in this file, nothing here ever calls its `update()`, and it is never
    handed to code we cannot see."""
    members = family(unit.scalers[0])
    if not any(m.creations for m in members):
        return False
    if any(m.calls("update") for m in members):
        return False
    return not any(escapes(ctx.names, m) for m in members)
