"""AMP207: `torch.autocast("cuda", False)`: the second positional parameter became `dtype` in 1.11."""

import ast

import libcst as cst

from ampmigrate.api import AUTOCAST
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.rules.base import Rule

_NO_SPACE = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class AutocastPositionalEnabled(Rule):
    code = "AMP207"
    triggers = (r"autocast",)
    qualified_prefixes = tuple(sorted(AUTOCAST))

    def screen(self, tree: ast.Module) -> bool:
        """Some call's second positional argument (stars aside) is `True` or `False`."""
        for call in nodes_of(tree, ast.Call):
            positional = [a for a in call.args if not isinstance(a, ast.Starred)]
            if len(positional) >= 2 and isinstance(positional[1], ast.Constant) and isinstance(positional[1].value, bool):
                return True
        return False

    def check(self, ctx) -> None:
        for ref, _ in ctx.names.find(AUTOCAST):
            call = ctx.names.parent(ref)
            if not isinstance(call, cst.Call) or call.func is not ref:
                continue
            positional = [a for a in call.args if a.keyword is None and not a.star]
            if len(positional) < 2:
                continue
            second = positional[1].value
            if not (isinstance(second, cst.Name) and second.value in ("True", "False")):
                continue
            message = (
                f"`{ctx.code(ref)}(..., {second.value})` passes a bool as `dtype` (torch 1.10's second "
                f"parameter was `enabled`; since 1.11 it is `dtype`), so autocast is disabled or raises; "
                f"write `enabled={second.value}`"
            )
            if len(positional) > 2 or any(a.keyword is not None and a.keyword.value == "enabled" for a in call.args):
                ctx.report(ref, message, no_fix_reason="the call's other arguments make the intent unclear")
                continue
            new_arg = positional[1].with_changes(keyword=cst.Name("enabled"), equal=_NO_SPACE)
            new_call = call.with_changes(args=[new_arg if a is positional[1] else a for a in call.args])
            fix = ctx.fix(f"Pass `enabled={second.value}` by keyword")
            ctx.report(ref, message, fix=fix.replace(call, new_call).build())
