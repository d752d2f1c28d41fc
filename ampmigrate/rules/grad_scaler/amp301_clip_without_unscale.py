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
from ampmigrate.diagnostics import UNSAFE
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
            move = accumulation_move(ctx, unit, finding)
            if move is not None:
                ctx.report(callee(finding.clip), message, fix=move)
                return
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


def accumulation_move(ctx, unit: UnitAnalysis, finding: ClipFinding):
    """Gradient accumulation that clips on every micro-step while `scaler.step` runs only in the
    stepping branch (`if (i + 1) % accum == 0:`): the fix maintainers write moves the clip into
    that branch, after one `scaler.unscale_(opt)` per optimizer stepped there (a `for opt in
    optimizers:` step loop gets a loop of `unscale_`). Unsafe: the clip then acts once on the
    accumulated gradients instead of on each micro-step's partial sum, which changes numerics.
    None where the code has another shape."""
    names = ctx.names
    steps = finding.steps
    statement = names.statement_of(finding.clip)
    if statement is None or not steps or not in_block(names, statement) or finding.kind != "clip":
        return None
    if len({ctx.code(step.receiver) for step in steps}) != 1 or not simple_expression(steps[0].receiver):
        return None
    block = names.parent(statement)
    siblings = list(block.body)
    index = siblings.index(statement)
    branch = next((s for s in siblings[index + 1 :] if isinstance(s, cst.If)), None)
    if branch is None or not all(_contains(names, branch.body, step.node) for step in steps):
        return None
    for between in siblings[index + 1 : siblings.index(branch)]:
        if _touches_gradients(names, between):
            return None
    if not _result_used_only_inside(names, statement, branch.body):
        return None
    scaler = ctx.code(steps[0].receiver)
    first = next(s for s in branch.body.body if any(_contains(names, s, step.node) or s is names.statement_of(step.node) for step in steps))
    unscales: List[cst.BaseStatement] = []
    done = set()
    for step in steps:
        loop = _optimizer_loop(names, step, branch.body)
        if loop is not None:
            key = id(loop)
            if key not in done:
                done.add(key)
                header = f"for {ctx.code(loop.target)} in {ctx.code(loop.iter)}:"
                body = f"{scaler}.unscale_({ctx.code(step.optimizer_expr)})"
                unscales.append(ctx.parse_statement(f"{header}\n    {body}\n"))
            continue
        if not step.optimizer.stable or not simple_expression(step.optimizer_expr):
            return None
        code = f"{scaler}.unscale_({ctx.code(step.optimizer_expr)})"
        if code not in done:
            done.add(code)
            unscales.append(line_of(ctx, code))
    clip = statement.with_changes(leading_lines=[line for line in statement.leading_lines if line.comment is not None])
    fix = ctx.fix(
        f"Move the clip into the stepping branch after `{scaler}.unscale_(...)` (unsafe: the clip then applies "
        "once to the accumulated gradients instead of to each micro-step's partial sum, which changes numerics)",
        UNSAFE,
    )
    fix.remove(statement)
    fix.insert_before(first, *unscales, clip)
    return fix.build()


def _optimizer_loop(names, step, within: cst.CSTNode) -> Optional[cst.For]:
    """`for opt in optimizers: scaler.step(opt)` inside the branch: the loop, when its target is
    the stepped optimizer and it iterates something that can be spelled again."""
    for ancestor in names.ancestors(step.node):
        if ancestor is within:
            return None
        if isinstance(ancestor, cst.For):
            if (
                isinstance(ancestor.target, cst.Name)
                and isinstance(step.optimizer_expr, cst.Name)
                and ancestor.target.value == step.optimizer_expr.value
                and simple_expression(ancestor.iter)
            ):
                return ancestor
            return None
    return None


_GRADIENT_METHODS = frozenset({"backward", "step", "unscale_", "zero_grad", "update"})


def _touches_gradients(names, statement: cst.CSTNode) -> bool:
    """A statement between the clip and the branch that may read or change gradients."""
    for call in names.nodes_of_type(cst.Call):
        if not _contains(names, statement, call):
            continue
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _GRADIENT_METHODS:
            return True
    for attribute in names.nodes_of_type(cst.Attribute):
        if attribute.attr.value == "grad" and _contains(names, statement, attribute):
            return True
    return False


def _result_used_only_inside(names, statement: cst.CSTNode, body: cst.CSTNode) -> bool:
    """The clip's statement is a bare call, or what it assigns is read only inside `body`."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if isinstance(small, cst.Expr):
        return True
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
        return False
    scope = names.scope_of(small.targets[0].target)
    for binding in scope.bindings.get(small.targets[0].target.value, []):
        if binding.node is small.targets[0].target:
            return all(_contains(names, body, ref) for ref in names.references(binding))
    return False


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
    return node is ancestor or any(a is ancestor for a in names.ancestors(node))
