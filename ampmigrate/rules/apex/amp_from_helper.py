"""AMP101 through a value: apex's amp module returned by a helper function of the run.

nlp-recipes keeps apex behind `get_amp(fp16)` (pytorch_utils.py: `from apex import amp` when
fp16, else `amp = None`; `return amp`); its trainers run `amp = get_amp(fp16)` or
`self.amp = get_amp(fp16)`, then `amp.initialize(...)`, `self.amp.load_state_dict(...)`. The
trainer's file never names apex, so neither the in-file plan nor the name screen sees it. The
project index records each function whose every return is apex's amp module or None
(engine/apex_values.py); this rule reports the amp calls on a name (or `self.` attribute) that
every assignment binds to a call of such a function or to None.

The fix is not made: the helper, each value it returns and every function that value is passed
to would change together (a GradScaler in place of the module), across files. The finding says so.
"""

from __future__ import annotations

import ast
import os
from typing import Optional

import libcst as cst

from ampmigrate.rules.apex.amp101_apex_amp import _REPLACEMENT as _ALL
from ampmigrate.rules.base import Rule

# The apex amp calls AMP101 names (the module's functions a real program calls on it).
APEX_AMP_CALLS = _APIS = frozenset(api for api in _ALL if api != "import")

_REASON = (
    "apex's amp module is the value of `{getter}()` ({origin}): the helper and every use of what it "
    "returns must change together (a GradScaler and autocast in place of the module), an edit the fix "
    "does not make yet"
)


class ApexAmpFromHelper(Rule):
    code = "AMP101"
    triggers = (r"\.(?:initialize|scale_loss|master_params|state_dict|load_state_dict|disable_casts)\b",)

    def applies_to_run(self, index) -> bool:
        """Only a run whose index records a function returning apex's amp module."""
        return index is not None and any(summary.apex_amp_getters for summary in index.modules.values())

    def screen(self, tree: ast.Module) -> bool:
        """Some `x.<api>(...)` or `self.x.<api>(...)` whose `x` some assignment binds to a call."""
        receivers = set()
        assigned = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _APIS:
                receivers.add(_last_name(node.func.value))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                assigned.update(_last_name(target) for target in node.targets)
        receivers.discard(None)
        return not receivers.isdisjoint(assigned)

    def check(self, ctx) -> None:
        index = ctx.file.project_index
        if index is None:
            return
        for call in ctx.names.nodes_of_type(cst.Call):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value in _APIS):
                continue
            found = self._getter_of(ctx, func.value)
            if found is None:
                continue
            getter, origin = found
            where = index.relative(origin)
            api = func.attr.value
            ctx.report(
                func,
                f"`amp.{api}` (apex's amp module returned by `{getter}()` of {where}) was removed from apex "
                f"in May 2025, so this no longer runs; use {_ALL[api]}",
                no_fix_reason=_REASON.format(getter=getter, origin=where),
            )

    def _getter_of(self, ctx, receiver: cst.BaseExpression):
        """(getter name, its file) when every binding of `receiver` is a call of a function that
        returns apex's amp module (or None), or None itself; at least one such call."""
        names = ctx.names
        if isinstance(receiver, cst.Name):
            bindings = names.bindings_of(receiver)
        elif isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name):
            if names.qualified_names(receiver.value):
                return None
            bindings = names.self_attribute_bindings(receiver)
        else:
            return None
        found = None
        for binding in bindings:
            value = binding.value
            if binding.kind != "assign" or value is None:
                return None
            if isinstance(value, cst.Name) and value.value == "None" and not names.bindings_of(value):
                continue
            if not isinstance(value, cst.Call):
                return None
            getter = self._getter(ctx, value.func)
            if getter is None:
                return None
            found = getter
        return found

    @staticmethod
    def _getter(ctx, func: cst.BaseExpression):
        index = ctx.file.project_index
        for qname in ctx.names.qualified_names(func):
            origin = index.apex_amp_getter(qname, ctx.file.path)
            if origin is not None:
                return qname.rpartition(".")[2], origin
        # A function of this file (a `def` at module level, the only binding of its name).
        if isinstance(func, cst.Name):
            bindings = ctx.names.bindings_of(func)
            own = index.modules.get(os.path.abspath(ctx.path))
            if (
                own is not None
                and len(bindings) == 1
                and bindings[0].kind == "def"
                and bindings[0].scope is ctx.names.module_scope
                and func.value in own.apex_amp_getters
            ):
                return func.value, os.path.abspath(ctx.path)
        return None


def _last_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None
