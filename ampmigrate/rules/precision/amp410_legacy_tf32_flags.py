"""AMP410: `torch.backends.cuda.matmul.allow_tf32 = ...` / `torch.backends.cudnn.allow_tf32 = ...`
-> the TF32 API of the oldest supported torch (`--min-torch`).

Below 2.9 the modern spelling of the matmul switch is `torch.set_float32_matmul_precision("high")`
(the same setting; cuDNN has no other switch there, so `cudnn.allow_tf32` stays). From 2.9 it is
the `fp32_precision` settings, and the two APIs must not be mixed: once a new-API flag is set,
the legacy getters raise RuntimeError. So with min-torch >= 2.9 every legacy TF32 use of the file
moves in one fix, and a legacy *read* the fix cannot move (`if torch.backends.cuda.matmul.allow_tf32:`,
`torch.get_float32_matmul_precision()`, `torch.backends.cudnn.flags(...)`) blocks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.values import UNKNOWN, literal_value, snippet
from ampmigrate.analysis.version_gates import version_gate
from ampmigrate.api import format_version
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import BF16_TARGET

NEW_API = (2, 9)  # torch.backends.*.fp32_precision
MATMUL_PRECISION_API = (1, 12)  # torch.set_float32_matmul_precision
MATMUL_FLAG = "torch.backends.cuda.matmul.allow_tf32"
CUDNN_FLAG = "torch.backends.cudnn.allow_tf32"
SET_MATMUL_PRECISION = "torch.set_float32_matmul_precision"
LEGACY_READERS = frozenset(
    {"torch.get_float32_matmul_precision", "torch.backends.cudnn.flags", MATMUL_FLAG, CUDNN_FLAG}
)


@dataclass(eq=False)
class _FlagAssignment:
    assign: cst.Assign
    target: cst.Attribute
    flag: str  # MATMUL_FLAG or CUDNN_FLAG


class LegacyTf32Flags(Rule):
    code = "AMP410"
    triggers = (r"allow_tf32",)
    qualified_prefixes = ("torch.backends",)  # the flags it rewrites live there

    def applies_to(self, path, settings) -> bool:
        return settings.target_dtype == BF16_TARGET  # pre-Ampere fleets have no TF32

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        assignments = [a for a in _flag_assignments(ctx) if version_gate(ctx.names, a.assign) is None]
        if ctx.settings.min_torch >= NEW_API:
            self._to_new_api(ctx, assignments)
        else:
            self._to_matmul_precision(ctx, [a for a in assignments if a.flag == MATMUL_FLAG])

    # ------------------------------------------------------------------ below 2.9
    def _to_matmul_precision(self, ctx, assignments: List[_FlagAssignment]) -> None:
        for assignment in assignments:
            message = (
                f"`{ctx.code(assignment.target)} = ...` is the legacy TF32 switch (CUDA builds of torch 2.9+ warn "
                "that it will be deprecated); `torch.set_float32_matmul_precision` is the same setting"
            )
            value = _precision_argument(ctx, assignment.assign.value, "high", "highest")
            reason = None
            if ctx.settings.min_torch < MATMUL_PRECISION_API:
                reason = f"`torch.set_float32_matmul_precision` needs torch >= 1.12; min-torch is {format_version(ctx.settings.min_torch)}"
            elif _uses_new_api(ctx):
                reason = "the file also uses the `fp32_precision` API, and the two must not be mixed"
            elif value is None:
                reason = "the value is an expression that would have to be evaluated twice"
            elif len(assignment.assign.targets) != 1:
                reason = "the statement assigns several targets"
            torch_name = None
            if reason is None:
                torch_name, needs_import = ctx.module_reference(assignment.assign, "torch")
                if torch_name is None:
                    reason = "the name `torch` is taken here"
            if reason is not None:
                ctx.report(assignment.target, message, no_fix_reason=reason)
                continue
            call = ctx.parse_expression(f"{torch_name}.set_float32_matmul_precision({ctx.code(value)})")
            fix = ctx.fix(f"Use `torch.set_float32_matmul_precision({ctx.code(value)})`")
            if needs_import:
                fix.require_import("torch")
            fix.replace(assignment.assign, cst.Expr(call, semicolon=assignment.assign.semicolon))
            ctx.report(assignment.target, message, fix=fix.build())

    # ------------------------------------------------------------------ 2.9 and newer
    def _to_new_api(self, ctx, assignments: List[_FlagAssignment]) -> None:
        if not assignments:
            return
        message_for = lambda a: (  # noqa: E731
            f"`{ctx.code(a.target)} = ...` is the legacy TF32 switch, which CUDA builds of torch 2.9+ warn "
            "will be deprecated; use the `fp32_precision` settings (and only those: the two APIs must not be mixed)"
        )
        changes: List[Tuple[cst.CSTNode, object]] = []
        reason = _legacy_reader(ctx)
        for assignment in assignments:
            if reason is not None:
                break
            change, reason = self._new_api_change(ctx, assignment)
            if change is not None:
                changes.append(change)
        if reason is None:
            for call, statement in _matmul_precision_calls(ctx):
                value = _precision_argument(ctx, call.args[0].value if call.args else None, "tf32", "ieee", modes=True)
                if value is None or statement is None:
                    reason = f"`{snippet(ctx, call)}` at line {ctx.position(call).start.line} has no `fp32_precision` equivalent the fix can write"
                    break
                target = ctx.parse_expression(f"{ctx.code(call.func.value)}.backends.cuda.matmul.fp32_precision")
                changes.append((statement, _assign(target, value, statement.semicolon)))
        if reason is not None:
            for assignment in assignments:
                ctx.report(assignment.target, message_for(assignment), no_fix_reason=reason)
            return
        fix = ctx.fix("Use the `fp32_precision` TF32 settings throughout the file")
        for node, new in changes:
            fix.replace(node, new)
        fix = fix.build()
        for assignment in assignments:
            ctx.report(assignment.target, message_for(assignment), fix=fix)

    def _new_api_change(self, ctx, assignment: _FlagAssignment):
        assign = assignment.assign
        if len(assign.targets) != 1:
            return None, "a statement assigns several targets"
        value = _precision_argument(ctx, assign.value, "tf32", "ieee")
        if value is None:
            return None, "a value is an expression that would have to be evaluated twice"
        base = assignment.target.value
        if assignment.flag == MATMUL_FLAG:
            target = cst.Attribute(value=base, attr=cst.Name("fp32_precision"))
            return (assign, _assign(target, value, assign.semicolon)), None
        # cudnn.allow_tf32 sets both cuDNN switches (conv and rnn).
        statements = [
            _assign(
                cst.Attribute(value=cst.Attribute(value=base, attr=cst.Name(op)), attr=cst.Name("fp32_precision")),
                value,
            )
            for op in ("conv", "rnn")
        ]
        line = ctx.names.parent(assign)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            first = line.with_changes(body=[statements[0]])
            second = cst.SimpleStatementLine(body=[statements[1]])
            return (line, cst.FlattenSentinel([first, second])), None
        return (
            assign,
            cst.FlattenSentinel(
                [
                    statements[0].with_changes(semicolon=cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))),
                    statements[1].with_changes(semicolon=assign.semicolon),
                ]
            ),
        ), None


def _assign(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression, semicolon=cst.MaybeSentinel.DEFAULT
) -> cst.Assign:
    return cst.Assign(targets=[cst.AssignTarget(target)], value=value, semicolon=semicolon)


def _precision_argument(ctx, value, on: str, off: str, modes: bool = False) -> Optional[cst.BaseExpression]:
    """The string for a legacy value: True -> `on`, False -> `off` (or "high" -> `on`, "highest"
    -> `off` for set_float32_matmul_precision); a name becomes a ternary; anything else None."""
    if value is None:
        return None
    literal = literal_value(value)
    if modes:
        mapping = {"high": on, "highest": off}
        return ctx.string(mapping[literal]) if literal in mapping else None
    if literal is True:
        return ctx.string(on)
    if literal is False:
        return ctx.string(off)
    if literal is UNKNOWN and isinstance(value, (cst.Name, cst.Attribute)):
        return ctx.parse_expression(f"{ctx.quote}{on}{ctx.quote} if {ctx.code(value)} else {ctx.quote}{off}{ctx.quote}")
    return None


def _flag_assignments(ctx) -> List[_FlagAssignment]:
    found = []
    for target in ctx.names.store_attributes:
        if target.attr.value != "allow_tf32":
            continue
        flags = ctx.names.qualified_names(target) & {MATMUL_FLAG, CUDNN_FLAG}
        assign = ctx.names.parent(ctx.names.parent(target))
        if len(flags) == 1 and isinstance(assign, cst.Assign):
            found.append(_FlagAssignment(assign, target, next(iter(flags))))
    return sorted(found, key=lambda a: (ctx.position(a.target).start.line, ctx.position(a.target).start.column))


def _uses_new_api(ctx) -> bool:
    for _node, qnames in ctx.names.qualified_expressions():
        if any(q.startswith("torch.backends.") and q.endswith(".fp32_precision") for q in qnames):
            return True
    for target in ctx.names.store_attributes:
        if target.attr.value == "fp32_precision" and any(
            q.startswith("torch.backends.") for q in ctx.names.qualified_names(target)
        ):
            return True
    return False


def _legacy_reader(ctx) -> Optional[str]:
    """Why the file cannot move to the new API: a legacy TF32 read that stays legacy."""
    for node, _qnames in ctx.names.find(LEGACY_READERS):
        parent = ctx.names.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            continue  # a longer chain; judged at its end
        line = ctx.position(node).start.line
        return (
            f"line {line} reads the legacy TF32 state (`{snippet(ctx, node)}`), which raises RuntimeError once "
            "an `fp32_precision` flag is set; move that by hand"
        )
    return None


def _matmul_precision_calls(ctx) -> List[Tuple[cst.Call, Optional[cst.Expr]]]:
    found = []
    for ref, _ in ctx.names.find({SET_MATMUL_PRECISION}):
        call = ctx.names.parent(ref)
        if not isinstance(call, cst.Call) or call.func is not ref or version_gate(ctx.names, call) is not None:
            continue
        statement = ctx.names.parent(call)
        torch_root = isinstance(ref, cst.Attribute) and ctx.names.qualified_names(ref.value) == frozenset({"torch"})
        found.append((call, statement if isinstance(statement, cst.Expr) and torch_root else None))
    return found
