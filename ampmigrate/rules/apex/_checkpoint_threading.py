"""apex.amp checkpoint helpers in another file: the GradScaler passed to them (engine/apex_checkpoint.py).

A helper's file (`utils.py` of Swin-Transformer) uses apex's amp only in `amp.state_dict()` /
`amp.load_state_dict(x)` inside top-level functions; the files calling those functions call
`amp.initialize` themselves. The migration:

- the helper (`_StateSide`): a new `scaler` parameter, `amp.state_dict()` -> `scaler.state_dict()`,
  `amp.load_state_dict(x)` -> loaded into the scaler only when `x` has GradScaler's layout (the
  in-file `_guarded_load`), apex's import gone;
- each caller (hooks of the in-file planner `_Planner` and the split A side `_InitSide`): every call
  of the helper gets `scaler=<the scaler there>`, the helper's scope joining the scaler's uses so
  the in-file plan threads it there (as a parameter or `self.scaler`) like any other use.

Both sides ask `decide_state` (the same index facts), and plan the other files of the group from
the bytes the index read: all migrate, with the same unsafe reasons, or none does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.apex_checkpoint import (
    STATE_APIS,
    StateDecision,
    decide_state,
    state_helpers_called,
)
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import AmpPlan, Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, _Planner
from ampmigrate.rules.apex._cross_threading import (
    _check_min_torch,
    _ParameterAccess,
    _plan_elsewhere,
    _spelled,
)
from ampmigrate.rules.apex._method_windows import _first_statement, _is_docstring
from ampmigrate.rules.apex._scaler_access import add_parameter

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ProjectIndex


def checkpoint_planner(ctx: FileContext) -> Optional[_Planner]:
    """The planner of a checkpoint helper's file, per the project index; None for other files."""
    index = ctx.project_index
    if index is None:
        return None
    facts = index.modules.get(os.path.abspath(ctx.path))
    if facts is None or not facts.apex_state_functions:
        return None
    return _StateSide(ctx)


# ---------------------------------------------------------------------------------- the group
def group_check(ctx: FileContext, path: str, function: str) -> Tuple[Optional[str], List[str]]:
    """(why helper `function` of the file at `path` and its callers cannot migrate together or
    None, the unsafe reasons every fix of the group carries). `decide_state`, then every member
    planned from the bytes the index read: the helper's plan must stop nowhere, and each caller's
    plan must pass the scaler to every call of the helper."""
    index: "ProjectIndex" = ctx.project_index
    memo = index.__dict__.setdefault("_apex_state_checks", {})
    key = (os.path.abspath(path), function)
    if key in memo:
        return memo[key]
    memo[key] = (None, [])  # being decided: a member planned from here asks no further
    decision = decide_state(index, path, function)
    problem = None if decision.migrate else decision.reason
    unsafe: List[str] = []
    members = (key[0], *decision.caller_paths, *decision.unpassed_paths) if problem is None else ()
    for member in members:
        planner, reason, member_unsafe = _plan_member(ctx, member)
        passing = member != key[0] and member not in decision.unpassed_paths
        if reason is None and passing and key not in getattr(planner, "helpers_passed", set()):
            reason = f"its migration passes no GradScaler to `{function}()`"
        if reason is not None:
            problem = f"{index.relative(member)} cannot be migrated with it: {reason}"
            break
        unsafe.extend(u for u in member_unsafe if u not in unsafe)
    memo[key] = (problem, unsafe)
    return memo[key]


def _plan_member(ctx: FileContext, path: str):
    from ampmigrate.rules.apex._amp_migration import _planner_for

    made: List[_Planner] = []

    def factory(other: FileContext) -> _Planner:
        planner = _planner_for(other)
        planner.verify = False
        planner.verify_helpers = False
        made.append(planner)
        return planner

    reason, unsafe = _plan_elsewhere(ctx, path, factory)
    return (made[0] if made else None), reason, unsafe


def _decide(planner: _Planner, path: str, function: str) -> StateDecision:
    decision = decide_state(planner.ctx.project_index, path, function)
    if not decision.migrate:
        return decision
    if getattr(planner, "verify_helpers", True):
        problem, unsafe = group_check(planner.ctx, path, function)
        if problem is not None:
            return StateDecision(False, problem)
        planner.unsafe.extend(u for u in unsafe if u not in planner.unsafe)
    return decision


# ---------------------------------------------------------------------------------- callers
def helper_calls(planner: _Planner) -> List[Tuple[cst.Call, Tuple[str, str], StateDecision]]:
    """The calls of checkpoint helpers of other files in the planner's file (with the helper and
    its decision); a helper that cannot take the scaler stops the plan."""
    index = planner.ctx.project_index
    if index is None:
        return []
    helpers = _local_helpers(planner)
    if not helpers:
        return []
    found = []
    decisions: Dict[str, StateDecision] = {}
    for node in walk(planner.module, into_scopes=True):
        name = _spelled(node.func) if isinstance(node, cst.Call) else ""
        if name not in helpers:
            continue
        path, function = helpers[name]
        if name not in decisions:
            decisions[name] = _decide(planner, path, function)
        decision = decisions[name]
        if not decision.migrate:
            raise Unfixable(
                f"`{name}()` ({index.relative(path)}) saves or loads apex's amp state and cannot take the GradScaler: "
                f"{decision.reason}"
            )
        if any(a.keyword is not None and a.keyword.value == decision.scaler for a in node.args) or any(
            a.star for a in node.args
        ):
            raise Unfixable(f"the call of `{name}()` at line {planner._line(node)} already passes `{decision.scaler}` or unpacks arguments")
        found.append((node, (os.path.abspath(path), function), decision))
    return found


def _local_helpers(planner: _Planner) -> Dict[str, Tuple[str, str]]:
    """{the helper as the planner's file spells it: (helper's path, helper's name)}: the local name
    it imports it as (`from m import Saver as Keeper`: Keeper), or `module.name` after a module
    import (engine/caller_uses.py finds every spelling)."""
    return state_helpers_called(planner.ctx.project_index, planner.ctx.path)


def pass_scaler(planner: _Planner, calls, what: str = "which saves or loads its state") -> None:
    """`helper(...)` -> `helper(..., scaler=<the scaler there>)`; the note says `what` the helper does with it."""
    passed = getattr(planner, "helpers_passed", set())
    init = getattr(planner, "init", None)
    home = getattr(planner, "home", None)
    for call, key, decision in calls:
        if call in planner.handled:
            raise Unfixable(f"the call of `{key[1]}()` at line {planner._line(call)} is rewritten otherwise")
        if init is not None and init.call is not None and planner._function_scope(call) is home and planner._line(call) < planner._line(init.call):
            raise Unfixable(
                f"`{key[1]}()` is called at line {planner._line(call)}, before `amp.initialize` (line "
                f"{planner._line(init.call)}) where the GradScaler it would take is created"
            )
        arg = cst.Arg(
            planner.ctx.parse_expression(planner.access.expression(call)),
            keyword=cst.Name(decision.scaler),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
        )
        planner.builder.replace(call, rebuild_args(call, [*call.args, arg]))
        planner.handled.add(call)
        passed.add(key)
    planner.helpers_passed = passed
    if calls:
        names = ", ".join(dict.fromkeys(f"`{key[1]}()`" for _, key, _ in calls))
        planner._note(f"the scaler is passed to {names} (another file), {what}")


def check_passed(planner: _Planner) -> None:
    """A fix that leaves a helper's call without the scaler would break it (the helper takes one)."""
    if planner.ctx.project_index is None:
        return
    helpers = _local_helpers(planner)
    if not helpers:
        return
    passed = getattr(planner, "helpers_passed", set())
    here = os.path.abspath(planner.ctx.path)
    for node in walk(planner.module, into_scopes=True):
        if isinstance(node, cst.Call) and _spelled(node.func) in helpers:
            path, function = helpers[_spelled(node.func)]
            decision = decide_state(planner.ctx.project_index, path, function)
            if here in decision.unpassed_paths:
                continue  # an inference caller: the helper's scaler defaults to None
            if not decision.migrate:
                # the helper stays on apex, whose state needs this file's `amp.initialize`
                raise Unfixable(
                    f"`{function}()` ({planner.ctx.project_index.relative(path)}) saves or loads apex's amp state and "
                    f"cannot be migrated: {decision.reason}"
                )
            if (os.path.abspath(path), function) not in passed and decision.migrate:
                raise Unfixable(
                    f"`{function}()` ({planner.ctx.project_index.relative(path)}) saves or loads apex's amp state, and "
                    "this migration has no GradScaler to pass to it"
                )


# ---------------------------------------------------------------------------------- the helper
class _StateSide(_Planner):
    """The helper's file: each function saving or loading apex's state takes the scaler."""

    verify = True
    verify_helpers = True

    def _build(self, plan: AmpPlan) -> Fix:
        self._check_star_refs()
        self._check_unreached_uses()
        self._check_other_refs()
        for binding in self.usage.import_bindings:
            if self.ctx.reexported(binding):
                raise Unfixable(f"`{binding.name}` is re-exported from here; the modules that import it must be migrated first")
        if any(r.api not in (None, *STATE_APIS) for r in self.refs):
            raise Unfixable(NO_INIT_REASON)
        index = self.ctx.project_index
        facts = index.modules[os.path.abspath(self.ctx.path)]
        self.decisions: Dict[str, StateDecision] = {}
        for name in facts.apex_state_functions:
            decision = _decide(self, self.ctx.path, name)
            if not decision.migrate:
                raise Unfixable(f"{NO_INIT_REASON} ({decision.reason})")
            self.decisions[name] = decision
        _check_min_torch(self)
        self.fp32 = False
        self.spec = None
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        scopes: List[Scope] = []
        classes: List[Scope] = []
        for ref in self.refs:
            if ref.api not in STATE_APIS:
                continue
            scope = self._function_scope(ref.node)
            cls = _saver_class(self, scope)
            if cls is not None:
                classes.append(cls)
                scopes.append(scope)
                continue
            name = getattr(scope.node, "name", None)
            if scope.parent is not self.names.module_scope or name is None or name.value not in self.decisions:
                raise Unfixable(NO_INIT_REASON)
            scopes.append(scope)
        self.access = _HelperAccess(self, scopes, classes, {n for n, d in self.decisions.items() if d.optional})
        self.scaler_scopes = list(dict.fromkeys(scopes))
        self._plan_simple_refs()
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        self.access.emit()
        names = ", ".join(f"`{n}()`" for n in self.decisions)
        callers = sorted({c for d in self.decisions.values() for c in d.callers}) or ["no caller"]
        if self.access.optional:
            self._note(
                f"{', '.join(f'`{n}()`' for n in sorted(self.access.optional))} is also called without a scaler (an "
                "inference setup, whose loss scale nothing used): there it loads no scaler state"
            )
        stored = f" (a class keeps it as `self.{self.access.name}`)" if self.access.classes else ""
        return self._finish(
            f"Migrate apex.amp's state to torch.amp.GradScaler: {names} takes the GradScaler that "
            f"{', '.join(callers)} creates where `amp.initialize` was, as a new `{self.access.name}` parameter{stored}"
        )


    def _guarded_load(self, ref, scaler: str, when: str = "") -> None:
        """In a helper an inference caller calls without the scaler, the load needs it there."""
        if self.access._optional(self._function_scope(ref.node)):
            when = f"{scaler} is not None"
        super()._guarded_load(ref, scaler, when)


def _saver_class(planner: _Planner, scope: Scope) -> Optional[Scope]:
    """The class scope of a checkpoint saver class (engine/apex_checkpoint.py `_class_record`)
    whose method `scope` is; None when `scope` is no method of one."""
    cls = scope.parent
    if scope.kind != "function" or cls is None or cls.kind != "class" or cls.parent is not planner.names.module_scope:
        return None
    name = cls.node.name.value
    if name not in planner.decisions:
        return None
    if isinstance(scope.node, cst.FunctionDef) and scope.node.decorators:
        raise Unfixable(f"{NO_INIT_REASON} (`{name}.{scope.node.name.value}()` is not a plain method)")
    return cls


class _HelperAccess(_ParameterAccess):
    """The scaler as a new parameter of each helper function, and of each saver class's
    constructor, which stores it first thing as `self.<name>` for its methods."""

    def __init__(self, planner: _Planner, scopes: List[Scope], classes: List[Scope], optional=frozenset()) -> None:
        self.classes = list(dict.fromkeys(classes))
        functions = [s for s in scopes if s.parent not in self.classes]
        self.optional = optional  # helpers an inference caller calls without the scaler
        super().__init__(planner, functions)
        self.methods = [s for s in scopes if s.parent in self.classes]

    def _optional(self, scope: Scope) -> bool:
        name = getattr(scope.node, "name", None)
        return name is not None and name.value in self.optional

    def expression(self, node: cst.CSTNode) -> str:
        scope = self.p._function_scope(node)
        if scope.parent in self.classes:
            params = scope.node.params.params
            if not params:
                raise Unfixable(f"{NO_INIT_REASON} (a method without `self` uses apex's amp state)")
            return f"{params[0].name.value}.{self.name}"
        return self.name

    def emit(self) -> None:
        super().emit()
        for cls in self.classes:
            init = next(
                (s for s in cls.node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
            )
            if init is None or not isinstance(init.body, cst.IndentedBlock) or not init.params.params:
                raise Unfixable(f"{NO_INIT_REASON} (`{cls.node.name.value}.__init__` cannot take the scaler)")
            self.p.builder.replace(init.params, add_parameter(init.params, self.name))
            statement = self.p.ctx.parse_statement(f"{init.params.params[0].name.value}.{self.name} = {self.name}\n")
            body = list(init.body.body)
            if len(body) == 1 and _is_docstring(body[0]):
                self.p.builder.insert_after(body[0], statement)
            else:
                self.p.builder.insert_before(_first_statement(init), statement)
