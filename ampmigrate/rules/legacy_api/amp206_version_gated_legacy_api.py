"""AMP206: legacy API kept behind a torch version check that min-torch makes dead.

The fix keeps the branch that every supported torch takes and deletes the other, as maintainers
do when they raise their minimum torch: only where the gate's condition is known on every torch
>= min-torch (analysis/version_outcome.py), the legacy spelling is in the deleted branch, and the
kept branch's modern names exist on min-torch.
"""

from typing import List, Optional, Sequence, Tuple, Union

import libcst as cst

from ampmigrate.analysis.version_gates import version_gate
from ampmigrate.analysis.version_outcome import outcome
from ampmigrate.api import MODERN_SINCE, format_version
from ampmigrate.engine.names import dotted
from ampmigrate.rules.base import Rule
from ampmigrate.rules.legacy_api._migration import LEGACY_PREFIXES, gated_message, legacy_groups

_GATES = (cst.If, cst.IfExp, cst.Try, cst.ExceptHandler)
_Kept = Union[cst.BaseExpression, Sequence[cst.BaseStatement]]


class VersionGatedLegacyApi(Rule):
    code = "AMP206"
    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        min_torch = ctx.settings.min_torch
        for group in legacy_groups(ctx.file):
            # Below the version that introduced the torch.amp spelling, the gate is still needed.
            if group.gate is None or not group.sites or group.min_since > min_torch:
                continue
            site = group.sites[0].ref
            # The legacy code inside the gate: the site, or the import the group's names come from.
            legacy, gate = site, group.gate
            if not isinstance(gate, _GATES):  # an import's group: the gate is around the import
                legacy = group.statement if group.statement is not None else site
                gate = version_gate(ctx.names, legacy)
            kept, reason = _kept_branch(ctx, gate, legacy) if gate is not None else (None, None)
            if kept is None:
                ctx.report(site, gated_message(group, min_torch), no_fix_reason=reason or group.reason)
                continue
            fix = ctx.fix(f"Keep only the branch that torch >= {format_version(min_torch)} takes")
            gate = _statement_or_expression(ctx, gate)
            fix.replace(gate, _replacement(gate, kept))
            if isinstance(gate, cst.If) and not any(a is gate for a in ctx.names.ancestors(legacy)):
                for dead in _unreachable_after(ctx, gate):
                    fix.remove(dead)
            ctx.report(site, gated_message(group, min_torch), fix=fix.build())


def _statement_or_expression(ctx, gate: cst.CSTNode) -> cst.CSTNode:
    return ctx.names.parent(gate) if isinstance(gate, cst.ExceptHandler) else gate


def _kept_branch(ctx, gate: cst.CSTNode, site: cst.CSTNode) -> Tuple[Optional[_Kept], Optional[str]]:
    """What replaces the gate, or (None, why not)."""
    names, min_torch = ctx.names, ctx.settings.min_torch
    if isinstance(gate, (cst.ExceptHandler, cst.Try)):
        return _kept_try(ctx, _statement_or_expression(ctx, gate))
    if isinstance(gate, cst.IfExp):
        value = outcome(names, gate.test, min_torch)
        if value is None:
            return None, _UNKNOWN
        kept = gate.body if value else gate.orelse
        return (None, _LEGACY_KEPT) if _contains(names, kept, site) else (kept, None)
    if isinstance(gate, cst.If):
        if names.parent(gate) is not None and isinstance(names.parent(gate), cst.If):
            return None, "an `elif` chain is left as it is"
        if not any(a is gate for a in names.ancestors(site)):
            return _kept_guard(ctx, gate)
        if isinstance(gate.orelse, cst.If):
            return None, "an `elif` chain is left as it is"
        value = outcome(names, gate.test, min_torch)
        if value is None:
            return None, _UNKNOWN
        block = gate.body if value else (gate.orelse.body if gate.orelse is not None else None)
        statements: List[cst.BaseStatement] = list(block.body) if isinstance(block, cst.IndentedBlock) else []
        if block is not None and not isinstance(block, cst.IndentedBlock):
            return None, "a one-line `if` body is left as it is"
        if any(_contains(names, s, site) for s in statements):
            return None, _LEGACY_KEPT
        return statements, None
    return None, None


def _kept_guard(ctx, guard: cst.If) -> Tuple[Optional[_Kept], Optional[str]]:
    """`if <new enough>: return <modern>` before the legacy code: when the check is always true,
    the guard's body replaces it and what followed it in the block never runs."""
    if guard.orelse is not None or not isinstance(guard.body, cst.IndentedBlock):
        return None, "an early-return version check with an `else` is left as it is"
    if outcome(ctx.names, guard.test, ctx.settings.min_torch) is not True:
        return None, _UNKNOWN
    return list(guard.body.body), None


def _unreachable_after(ctx, guard: cst.If) -> List[cst.CSTNode]:
    block = ctx.names.parent(guard)
    body = list(getattr(block, "body", ()))
    index = next(i for i, statement in enumerate(body) if statement is guard)
    return body[index + 1 :]


def _kept_try(ctx, statement: cst.CSTNode) -> Tuple[Optional[_Kept], Optional[str]]:
    """`try: from torch.amp import X / except ImportError: <legacy>`: the try body, when it holds
    only imports of modern names that min-torch has."""
    if not isinstance(statement, cst.Try) or len(statement.handlers) != 1 or statement.orelse or statement.finalbody:
        return None, "a try-import with more than one handler, `else` or `finally` is left as it is"
    body = statement.body
    if not isinstance(body, cst.IndentedBlock):
        return None, "a one-line `try` is left as it is"
    for line in body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return None, "the `try` body does more than import"
        for small in line.body:
            if not isinstance(small, cst.ImportFrom) or small.relative or isinstance(small.names, cst.ImportStar):
                return None, "the `try` body does more than import"
            module = dotted(small.module) if small.module is not None else None
            for alias in small.names:
                since = MODERN_SINCE.get(f"{module}.{dotted(alias.name)}") or MODERN_SINCE.get(module or "")
                if since is None or since > ctx.settings.min_torch:
                    return None, "the `try` body imports a name min-torch may not have"
    return list(body.body), None


def _replacement(gate: cst.CSTNode, kept: _Kept):
    if isinstance(kept, cst.BaseExpression):
        # The ternary's own parentheses stay around what replaces it.
        return kept.with_changes(lpar=[*gate.lpar, *kept.lpar], rpar=[*kept.rpar, *gate.rpar])
    if not kept:
        return cst.RemovalSentinel.REMOVE
    first = kept[0]
    # Comments and blank lines above the `if`/`try` stay above the code that replaces it.
    kept = [first.with_changes(leading_lines=[*gate.leading_lines, *first.leading_lines]), *kept[1:]]
    return cst.FlattenSentinel(kept)


def _contains(names, tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    return tree is node or any(a is tree for a in names.ancestors(node))


_UNKNOWN = "the version check's value on every torch >= min-torch is not known here"
_LEGACY_KEPT = "the branch that min-torch keeps holds the legacy spelling"
