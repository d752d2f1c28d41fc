"""AMP301: gradients clipped (or their norm read) while still multiplied by the loss scale.

`scaler.scale(loss).backward()` leaves every gradient multiplied by the loss scale (65536 at the
start). A clip between that backward and `scaler.step(opt)` with no `scaler.unscale_(opt)` before
it compares scaled gradients against an unscaled threshold: with max_norm=1.0 it shrinks them
to norm 1 *before* the step divides them by 65536, so updates are tiny. The fix inserts
`scaler.unscale_(opt)` right before the clip (one per optimizer stepped after it), the
documented recipe; `scaler.step` then knows the gradients are already unscaled.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from ampmigrate.analysis import flow
from ampmigrate.analysis.scaler_protocol import ClipFinding, UnitAnalysis, analyses
from ampmigrate.rules.grad_scaler._shared import (
    callee,
    in_block,
    line_of,
    simple_expression,
    step_classifier,
)
from ampmigrate.rules.grad_scaler._shared import ProtocolRule, scaler_origin


class ClipWithoutUnscale(ProtocolRule):
    code = "AMP301"

    def check(self, ctx) -> None:
        for unit in analyses(ctx.file):
            for finding in unit.clip_findings.values():
                self._report(ctx, unit, finding)

    def _report(self, ctx, unit: UnitAnalysis, finding: ClipFinding) -> None:
        steps = finding.optimizers()
        scaler = ctx.code(steps[0].receiver)
        optimizers = [ctx.code(step.optimizer_expr) for step in steps]
        unscales = " and ".join(f"`{scaler}.unscale_({opt})`" for opt in optimizers)
        what = f"`{finding.detail}`" if finding.detail else "this call"
        if finding.elsewhere:
            what += f" (defined in {finding.elsewhere})"
        if finding.kind == "read":
            message = (
                f"{what} reads gradients still multiplied by the loss scale: "
                f"call {unscales} first, or the value is off by the scale factor"
            )
        else:
            message = (
                f"{what} clips gradients still multiplied by the loss scale: "
                f"call {unscales} first, or the threshold applies to scaled gradients"
            )
        message += scaler_origin(ctx, unit)
        reason, statement = self._fix_blocker(ctx, unit, finding)
        if reason is not None:
            ctx.report(callee(finding.clip), message, no_fix_reason=reason)
            return
        fix = ctx.fix(f"Insert {unscales} before the {'read' if finding.kind == 'read' else 'clip'}")
        fix.insert_before(statement, *(line_of(ctx, f"{scaler}.unscale_({opt})") for opt in optimizers))
        ctx.report(callee(finding.clip), message, fix=fix.build())

    def _fix_blocker(self, ctx, unit: UnitAnalysis, finding: ClipFinding):
        """(why no fix, None) or (None, the statement to insert before)."""
        steps = finding.optimizers()
        clip = finding.clip
        if clip in unit.clip_unknown:
            return "a call before it may already unscale the gradients on some path", None
        if clip in unit.clip_after_other_clip:
            return "an earlier clip in the same step gets the `unscale_` first", None
        if any(not step.optimizer.stable or not simple_expression(step.optimizer_expr) for step in steps):
            return "the optimizer is chosen per iteration; unscale each one before the clip by hand", None
        if any(step.optimizer in unit.clip_unscaled.get(clip, ()) for step in steps):
            return "on another path the gradients are already unscaled here; a second `unscale_` would raise", None
        if len({ctx.code(step.receiver) for step in steps}) != 1:
            return "the optimizers are stepped through differently named scalers", None
        statement = _insertion_statement(ctx.names, clip, [s.node for s in steps], unit.owner)
        if statement is None or not in_block(ctx.names, statement):
            return "the clip is not a statement of its own block", None
        for step in steps:
            if not flow.reaches(ctx.names, statement, step_classifier(unit.events, step.optimizer)):
                return (
                    f"`{ctx.code(step.node)}` does not follow the clip on every path (before the next backward); "
                    "an `unscale_` there could run on iterations that do not step"
                ), None
        return None, statement


def _insertion_statement(names, clip: cst.CSTNode, steps: List[cst.CSTNode], owner: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The statement holding the clip, lifted out of inner loops that do not also step
    (`for p in params: p.grad.norm()` gets one `unscale_` before the loop, not one per parameter)."""
    statement = names.statement_of(clip)
    if statement is None:
        return None
    for ancestor in names.ancestors(statement):
        if ancestor is owner:
            break
        if isinstance(ancestor, (cst.For, cst.While)) and not any(_contains(names, ancestor, s) for s in steps):
            statement = ancestor
    return statement


def _contains(names, ancestor: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(a is ancestor for a in names.ancestors(node))
