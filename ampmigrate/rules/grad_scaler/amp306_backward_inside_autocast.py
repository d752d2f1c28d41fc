"""AMP306: `backward()` called inside an autocast region.

The torch docs: autocast should wrap only the forward pass and the loss; backward passes under
autocast are not recommended (backward ops already run in the dtype autocast chose for the
matching forward ops). Inside the region the backward also keeps any op it runs outside autograd
(hooks, `create_graph=True` double backward) under autocast. The fix moves the backward, and the
protocol calls after it that close the `with` body, out of the region: a pure move, since
backward's dtypes come from the forward pass.
"""

from __future__ import annotations

from typing import Dict, Optional

import libcst as cst

from ampmigrate.analysis.autocast_regions import Region, enclosing_region
from ampmigrate.analysis.scaler_protocol import (
    BACKWARD,
    CLIP,
    PLAIN_STEP,
    SCALED_BACKWARD,
    STEP,
    UNSCALE,
    UPDATE,
    ZERO_GRAD,
    EventReader,
    analyses,
)
from ampmigrate.rules.base import Rule
from ampmigrate.rules.grad_scaler._shared import TRIGGERS, call_statement, callee, in_block
from ampmigrate.rules.grad_scaler._shared import SCALER_PREFIXES

_PROTOCOL = (SCALED_BACKWARD, BACKWARD, UNSCALE, STEP, UPDATE, ZERO_GRAD, PLAIN_STEP, CLIP)


class BackwardInsideAutocast(Rule):
    code = "AMP306"
    triggers = TRIGGERS
    qualified_prefixes = SCALER_PREFIXES

    def check(self, ctx) -> None:
        fixes: Dict[cst.With, object] = {}
        for unit in analyses(ctx.file):
            events = unit.events.all_events()
            if not any(e.kind == SCALED_BACKWARD for e in events):
                continue
            for event in events:
                if event.kind not in (SCALED_BACKWARD, BACKWARD):
                    continue
                region = enclosing_region(ctx.file, event.node, stop=unit.owner)
                if region is None or region.enabled is False:
                    continue
                message = (
                    f"`{ctx.code(event.node)}` runs inside `{ctx.code(region.item.item)}`: autocast should wrap only "
                    "the forward pass and the loss (torch docs); move the backward after the `with` block"
                )
                if region.statement not in fixes:
                    fixes[region.statement] = self._fix(ctx, unit.events, region, event.node)
                fix = fixes[region.statement]
                if isinstance(fix, str):
                    ctx.report(callee(event.node), message, no_fix_reason=fix)
                else:
                    ctx.report(callee(event.node), message, fix=fix)

    def _fix(self, ctx, reader: EventReader, region: Region, backward: cst.Call):
        names = ctx.names
        statement = call_statement(names, backward)
        body = region.statement.body
        if statement is None or names.parent(statement) is not body:
            return "the backward is not a line of its own directly in the `with` body"
        if not region.only_item:
            return "the `with` statement has other context managers too"
        if not in_block(names, region.statement):
            return "the `with` statement is not in a block of its own"
        index = list(body.body).index(statement)
        if index == 0:
            return "nothing but the backward is inside the region"
        trailing = list(body.body[index:])
        for line in trailing:
            if not _protocol_line(reader, line):
                return f"`{ctx.code(line).strip()}` after the backward may depend on running under autocast"
        fix = ctx.fix("Move the backward (and the protocol calls after it) out of the autocast block")
        fix.replace(region.statement, region.statement.with_changes(body=body.with_changes(body=body.body[:index])))
        fix.insert_after(region.statement, *trailing)
        return fix.build()


def _protocol_line(reader: EventReader, line: cst.CSTNode) -> bool:
    """A line that only calls backward / the scaler / the optimizer / a clip (autocast-neutral)."""
    if not isinstance(line, cst.SimpleStatementLine):
        return False
    for small in line.body:
        value: Optional[cst.BaseExpression] = None
        if isinstance(small, cst.Expr):
            value = small.value
        elif isinstance(small, cst.Assign):
            value = small.value
        if not isinstance(value, cst.Call):
            return False
        if not any(e.node is value and e.kind in _PROTOCOL for e in reader.of(small)):
            return False
    return True
