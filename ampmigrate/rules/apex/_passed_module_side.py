"""The function's end of _passed_training.py: a top-level function that receives apex's amp
module from another file in a parameter and scales its loss with it takes the GradScaler there.

The plan is the in-file one (_amp_migration._Planner) on the parameter's uses, as if the module
had been followed into the function from a caller of the same file (_amp_refs.py, "slots"): the
parameter is renamed `scaler`, `p.scale_loss(...)` and the step become the GradScaler's, the
forward pass goes under `torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled())`
(the caller's opt level and condition travel with the scaler), and `p is not None` becomes
`scaler.is_enabled()`: the callers pass a scaler that is disabled exactly where they passed None
(_passed_training.py checks that every call passes it).
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import libcst as cst

from ampmigrate.api import APEX_AMP_API, APEX_AMP_MODULE
from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.context import FileContext, FixBuilder
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import AmpPlan, Site, Unfixable
from ampmigrate.rules.apex._amp_migration import CODE, _Planner
from ampmigrate.rules.apex._amp_refs import AmpRef, AmpUsage, _called
from ampmigrate.rules.apex._cross_threading import _check_min_torch
from ampmigrate.rules.apex._scaler_access import SCALER_NAMES

_FOLLOWED = (None, "scale_loss", "master_params")  # what the parameter may be used for


def plan_function(ctx: FileContext, function: str, param: str, verify: bool = True) -> Tuple[Optional[str], List[str]]:
    """(why the function's end finds no fix or None, what makes it unsafe)."""
    planner = PassedModuleSide(ctx, function, param)
    planner.verify = verify
    plan = planner.plan()
    if plan.fix is None:
        return plan.reason or "nothing to migrate", []
    return None, list(planner.unsafe)


def function_fix(ctx: FileContext, function: str, param: str) -> Tuple[Optional[Fix], Optional[str]]:
    """(the function's end of the migration, None) or (None, why not), after the group check."""
    from ampmigrate.rules.apex._passed_training import group_problem

    problem = group_problem(ctx, (os.path.abspath(ctx.path), function, param), caller=os.path.abspath(ctx.path))
    if problem is not None:
        return None, problem
    planner = PassedModuleSide(ctx, function, param)
    plan = planner.plan()
    return plan.fix, plan.reason


class PassedModuleSide(_Planner):
    verify = True

    def __init__(self, ctx: FileContext, function: str, param: str) -> None:
        super().__init__(ctx)
        self.function_name = function
        self.param_name = param

    def plan(self) -> AmpPlan:
        plan = AmpPlan()
        try:
            function, param, refs = self._parameter_refs()
        except Unfixable as exc:
            plan.reason = str(exc)
            return plan
        for ref in refs:
            if ref.api is not None:
                plan.sites.append(Site(ref.node, CODE, ref.api))
        self.function, self.param = function, param
        self.usage = AmpUsage(refs, [], [], {function: param}, None)
        self.refs = refs
        try:
            plan.fix = self._build(plan)
        except Unfixable as exc:
            plan.reason = str(exc)
        return plan

    def _parameter_refs(self) -> Tuple[cst.FunctionDef, cst.Param, List[AmpRef]]:
        names = self.names
        function = next(
            (s for s in self.module.body if isinstance(s, cst.FunctionDef) and s.name.value == self.function_name), None
        )
        if function is None:
            raise Unfixable(f"`{self.function_name}()` is not a top-level function of this file")
        params = function.params
        param = next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == self.param_name), None)
        if param is None:
            raise Unfixable(f"`{self.function_name}()` has no parameter `{self.param_name}`")
        scope = names.scope_of(function.body)
        bindings = scope.bindings.get(self.param_name, []) if scope is not None else []
        if len(bindings) != 1 or bindings[0].kind != "param":
            raise Unfixable(f"`{self.param_name}` is bound again in `{self.function_name}()`")
        refs: List[AmpRef] = []
        for use in names.references(bindings[0]):
            parent = names.parent(use)
            if isinstance(parent, cst.Attribute) and parent.value is use:
                api = APEX_AMP_API.get(f"{APEX_AMP_MODULE}.{parent.attr.value}", "unknown")
                refs.append(AmpRef(parent, api, _called(names, parent)))
            else:
                refs.append(AmpRef(use, None, _called(names, use)))
        for ref in refs:
            if ref.api not in _FOLLOWED:
                raise Unfixable(
                    f"`{self.ctx.code(ref.node).strip()}` at line {self._line(ref.node)} has no GradScaler counterpart here"
                )
            if ref.api is None and names.scope_of(ref.node) is not scope:
                raise Unfixable(f"`{self.param_name}` is used in a function nested in `{self.function_name}()`")
        return function, param, refs

    def _build(self, plan: AmpPlan) -> Fix:
        _check_min_torch(self)
        self.fp32 = False
        self.spec = None
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        steps = [self._step(r) for r in self.refs if r.api == "scale_loss"]
        if not steps:
            raise Unfixable(f"`{self.function_name}()` scales no loss with `{self.param_name}`")
        home = self.names.scope_of(self.function.body)
        if any(step.function is not home for step in steps):
            raise Unfixable(f"`{self.param_name}.scale_loss` runs in a function nested in `{self.function_name}()`")
        self._plan_fp16(steps)
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        return self._finish(
            f"Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler: `{self.function_name}()` takes the "
            f"GradScaler its callers make where `amp.initialize` was, in apex's place (`{self.param_name}`, renamed "
            f"`{self.access.name}`); autocast is enabled when the scaler is"
        )

    def _scaler_access(self, scopes: List[Scope]) -> "_RenamedParameter":
        return _RenamedParameter(self, scopes)

    def _plan_scaler_creation(self) -> None:
        """The callers make it."""

    def _presence_as_enabled(self):
        access = self.access
        home = self.names.scope_of(self.function.body)

        def present(ref: cst.CSTNode) -> cst.BaseExpression:
            if self._function_scope(ref) is not home:
                raise Unfixable(f"`{self.ctx.code(ref).strip()}` at line {self._line(ref)} is outside `{self.function_name}()`")
            return self.ctx.parse_expression(f"{access.name}.is_enabled()")

        return present


class _RenamedParameter:
    """The scaler in the parameter that held apex's module, renamed (the ScalerAccess interface)."""

    mode = "parameter"

    def __init__(self, planner: PassedModuleSide, scopes: List[Scope]) -> None:
        self.p = planner
        self.threaded: List[Scope] = []
        self.hoist_before = None
        self.enabled_keys = frozenset()
        self.conditions = []
        home = planner.names.scope_of(planner.function.body)
        taken = set(home.bindings) | {n.value for n in planner.names.loads}
        self.name = next((n for n in SCALER_NAMES if n not in taken), None)
        if self.name is None:
            raise Unfixable(f"every usual name for the scaler is taken in `{planner.function_name}()`")

    def expression(self, node: cst.CSTNode) -> str:
        return self.name

    def home_expression(self) -> str:
        return self.name

    def creation_enabled(self) -> Optional[str]:
        return None

    def autocast_enabled(self, at: cst.CSTNode) -> Optional[str]:
        return f"{self.name}.is_enabled()"  # the caller's opt level and condition, carried by the scaler

    def carried(self, node: cst.CSTNode) -> Optional[str]:
        return None

    def model_keys(self, function: Scope, depth: int = 0):
        """The parameters named like a model: what the callers pass their model in."""
        node = function.node
        if not isinstance(node, cst.FunctionDef):
            return set()
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        return {p for p in params if "model" in p.lower() or "net" in p.lower()}

    def emit(self) -> None:
        self.p.builder.replace(self.p.param.name, cst.Name(self.name))
