"""AMP307: the loss is computed outside the autocast region from its float16 outputs.

Autocast runs losses such as `cross_entropy`, `nll_loss`, `mse_loss`, `kl_div` in float32 (they
are on its "autocast to float32" list). Computed after the `with` block on the float16 logits the
region produced, the same call runs in float16: `F.cross_entropy` on float16 logits returns a
float16 loss, with float16's 3 significant digits and 65504 maximum, and that is what gets scaled
and backpropagated. The fix moves the loss statement into the region when it directly follows the
`with` block and computes nothing but the loss (possibly divided by a constant).
"""

from __future__ import annotations

from typing import FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.autocast_regions import Region, enclosing_region
from ampmigrate.analysis.scaler_protocol import SCALED_BACKWARD, UnitAnalysis, analyses
from ampmigrate.api import FP32_AUTOCAST_LOSS_CLASSES, FP32_AUTOCAST_LOSSES
from ampmigrate.engine.names import Binding
from ampmigrate.rules.base import Rule
from ampmigrate.rules.grad_scaler._shared import TRIGGERS, in_block, moved, remove_statement
from ampmigrate.rules.grad_scaler._shared import SCALER_PREFIXES

# Methods that change a tensor's shape but keep its dtype (a cast would make the input float32).
_SHAPE_METHODS = frozenset(
    {"view", "reshape", "squeeze", "unsqueeze", "permute", "transpose", "flatten", "contiguous", "view_as", "reshape_as"}
)


class LossOutsideAutocast(Rule):
    code = "AMP307"
    triggers = TRIGGERS
    qualified_prefixes = SCALER_PREFIXES

    def check(self, ctx) -> None:
        reported = set()
        for unit in analyses(ctx.file):
            for event in unit.events.all_events():
                if event.kind != SCALED_BACKWARD or event.scaled is None:
                    continue
                for binding in _loss_bindings(ctx, event.scaled):
                    found = self._loss_call(ctx, unit, binding)
                    if found is None or found[0] in reported:
                        continue
                    call, region = found
                    reported.add(call)
                    self._report(ctx, binding, call, region)

    def _loss_call(self, ctx, unit: UnitAnalysis, binding: Binding) -> Optional[Tuple[cst.Call, Region]]:
        """The fp32-autocast loss call `binding` assigns, computed outside autocast from the
        output of a float16 region of the same function."""
        names = ctx.names
        if binding.kind != "assign" or binding.value is None:
            return None
        call = _loss_in(ctx, binding.value)
        if call is None or not call.args or call.args[0].keyword is not None:
            return None
        if enclosing_region(ctx.file, call, stop=unit.owner) is not None:
            return None  # inside a region (or a deliberately disabled one)
        if names.enclosing(call, (cst.FunctionDef,)) is not _function(unit.owner):
            return None
        root = _tensor_root(call.args[0].value)
        if root is None:
            return None
        sources = names.bindings_of(root)
        if not sources:
            return None
        found: Optional[Region] = None
        for source in sources:
            if source.kind != "assign" or source.statement is None:
                return None
            if source.value is not None and _is_cast(source.value):
                return None
            region = enclosing_region(ctx.file, source.statement, stop=unit.owner)
            if region is None or region.enabled is False or region.float16 is False:
                return None
            if found is not None and region is not found:
                return None
            found = region
        return (call, found) if found is not None else None

    def _report(self, ctx, binding: Binding, call: cst.Call, region: Region) -> None:
        message = (
            f"`{ctx.code(call.func)}(...)` runs after the `with {ctx.code(region.item.item)}` block on its float16 "
            "output, so the loss is computed in float16; inside the block autocast computes it in float32"
        )
        reason, line = _move_plan(ctx, binding, call, region)
        if reason is not None:
            ctx.report(call.func, message, no_fix_reason=reason)
            return
        body = region.statement.body
        fix = ctx.fix("Move the loss computation into the autocast block")
        fix.replace(region.statement, region.statement.with_changes(body=body.with_changes(body=[*body.body, moved(line)])))
        remove_statement(fix, ctx.names, line)
        ctx.report(call.func, message, fix=fix.build())


def _function(owner: cst.CSTNode) -> Optional[cst.CSTNode]:
    return owner if isinstance(owner, cst.FunctionDef) else None


def _loss_bindings(ctx, scaled: cst.BaseExpression) -> List[Binding]:
    """Assignments of the names in `scaler.scale(...)`'s argument (`loss`, `loss / accum`)."""
    names: List[cst.Name] = []
    if isinstance(scaled, cst.Name):
        names.append(scaled)
    elif isinstance(scaled, cst.BinaryOperation):
        names.extend(side for side in (scaled.left, scaled.right) if isinstance(side, cst.Name))
    out: List[Binding] = []
    for name in names:
        for binding in ctx.names.bindings_of(name):
            out.append(binding)
            # `loss = loss / accum` style rebinding: follow the names it reads, one level.
            if binding.kind == "assign" and isinstance(binding.value, cst.BinaryOperation):
                for side in (binding.value.left, binding.value.right):
                    if isinstance(side, cst.Name):
                        out.extend(b for b in ctx.names.bindings_of(side) if b not in out)
    return out


def _loss_in(ctx, value: cst.BaseExpression) -> Optional[cst.Call]:
    """`criterion(out, y)` or `F.cross_entropy(...)`, possibly `/ accum` or `* weight`."""
    if isinstance(value, cst.BinaryOperation):
        for side in (value.left, value.right):
            found = _loss_in(ctx, side)
            if found is not None:
                return found
        return None
    if not isinstance(value, cst.Call):
        return None
    names = ctx.names
    if names.qualified_names(value.func) & FP32_AUTOCAST_LOSSES:
        return value
    if _module_classes(names, value.func) & FP32_AUTOCAST_LOSS_CLASSES:
        return value
    return None


def _module_classes(names, expr: cst.BaseExpression) -> FrozenSet[str]:
    """Classes of a loss module, also when made as `nn.CrossEntropyLoss().cuda()` / `.to(device)`."""
    classes = names.instance_classes(expr)
    if classes or not isinstance(expr, cst.Name):
        return classes
    found: Set[str] = set()
    for binding in names.bindings_of(expr):
        value = binding.value
        while (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("cuda", "to", "cpu")
            and isinstance(value.func.value, cst.Call)
        ):
            value = value.func.value
        if isinstance(value, cst.Call):
            found |= names.qualified_names(value.func)
    return frozenset(found)


def _tensor_root(expr: cst.BaseExpression) -> Optional[cst.Name]:
    """`out`, `out.logits`, `out[0]`, `out.view(-1, n)` -> `out`; a cast (`out.float()`) -> None."""
    while True:
        if isinstance(expr, cst.Name):
            return expr
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SHAPE_METHODS:
            expr = expr.func.value
        else:
            return None


def _is_cast(value: cst.BaseExpression) -> bool:
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("float", "double", "to", "type")
    )


def _move_plan(ctx, binding: Binding, call: cst.Call, region: Region):
    names = ctx.names
    small = binding.statement
    line = names.parent(small)
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return "the loss shares its line with other statements", None
    if not region.only_item or not in_block(names, region.statement) or not in_block(names, line):
        return "the autocast `with` has other context managers, or is not a plain block", None
    block = names.parent(line).body
    index = list(block).index(line)
    if index == 0 or block[index - 1] is not region.statement:
        return "the loss does not directly follow the autocast block", None
    value = binding.value
    if value is not call and not (
        isinstance(value, cst.BinaryOperation)
        and call in (value.left, value.right)
        and all(side is call or _plain(side) for side in (value.left, value.right))
    ):
        return "the statement computes more than the loss; moving it would put that under autocast too", None
    if not all(_plain(arg.value) or _tensor_root(arg.value) is not None for arg in call.args):
        return "the loss's arguments compute things that would then run under autocast", None
    return None, line


def _plain(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Name, cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Attribute):
        return _plain(expr.value)
    return False
