"""Both sides of engine/apex_owned_optimizer.py's shape: a script calls `amp.initialize` on an
object whose class builds and scales with its own optimizer.

- The class's file (`_OwnerSide`): the in-file planner on the scaled backwards, the scaler read as
  `self.<scaler>`, autocast enabled as it is; the class's `__init__` makes it disabled first
  thing (after a leading `super().__init__(...)`), so an instance no script sets up has one.
- The script (`_ScriptSide`): the in-file planner whose setup replaces `amp.initialize` with
  `<object>.<scaler> = torch.amp.GradScaler("cuda", enabled=...)` where it was, under the same
  `if`s (the class's default covers the other paths), `enabled=` from the opt level.

Every side asks `decide_owned` and plans the others from the index's bytes: all migrate, with the
same unsafe reasons, or none does.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import is_pure
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.apex_owned_optimizer import OwnedDecision, decide_owned
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import AmpPlan, Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, NO_STEP_REASON, _Planner
from ampmigrate.rules.apex._base_class import AttributeReadingSide, _InheritedAccess
from ampmigrate.rules.apex._cross_threading import _check_min_torch, _plan_elsewhere
from ampmigrate.rules.apex._method_windows import _first_statement, _is_docstring
from ampmigrate.rules.apex._scaler_access import ScalerAccess


def owned_planner(ctx: FileContext) -> Optional[_Planner]:
    """The planner of a script setting apex up on an object, or of a class owning its optimizer,
    per the project index; None for any other file."""
    index = ctx.project_index
    facts = index.modules.get(os.path.abspath(ctx.path)) if index is not None else None
    if facts is None:
        return None
    if facts.apex_instance_setups:
        return _ScriptSide(ctx)
    if facts.apex_owned_optimizers and not (facts.apex_step_functions or facts.apex_subclass_steps):
        return _OwnerSide(ctx)
    return None


def group_check(ctx: FileContext, attribute: str) -> Tuple[Optional[str], List[str]]:
    """(why the group of `attribute` cannot migrate or None, its unsafe reasons); one answer per run."""
    index = ctx.project_index
    memo = index.__dict__.setdefault("_apex_owned_group_checks", {})
    if attribute not in memo:
        decision = decide_owned(index, attribute)
        problem = None if decision.migrate else decision.reason
        unsafe: List[str] = []
        members = [*decision.scripts, *dict.fromkeys(p for p, _ in decision.classes)]
        for member in members if problem is None else ():
            reason, member_unsafe = _plan_elsewhere(ctx, member, owned_planner)
            if reason is not None:
                problem = f"{index.relative(member)} cannot be migrated with it: {reason}"
                break
            unsafe.extend(u for u in member_unsafe if u not in unsafe)
        memo[attribute] = (problem, unsafe)
    return memo[attribute]


def _owners(index, attribute: str) -> bool:
    return any(a == attribute for facts in index.modules.values() for a, _ in facts.apex_owned_optimizers.values())


# ---------------------------------------------------------------------------------- the script
class _ScriptSide(_Planner):
    verify = True  # plan the other files of the group too (not when planned from one of them)

    def _fix_without_steps(self, plan: AmpPlan) -> Optional[Fix]:
        index = self.ctx.project_index
        facts = index.modules[os.path.abspath(self.ctx.path)]
        if self.init.api != "initialize" or len(facts.apex_instance_setups) != 1:
            return super()._fix_without_steps(plan)
        owner, attribute, _ = facts.apex_instance_setups[0]
        decision = decide_owned(index, attribute)
        if not decision.migrate and not _owners(index, attribute):
            return super()._fix_without_steps(plan)  # no class of the run owns such an optimizer: not this shape
        if not decision.migrate:
            raise Unfixable(f"{NO_STEP_REASON} ({decision.reason})")
        problem, unsafe = group_check(self.ctx, attribute) if self.verify else (None, [])
        if problem is not None:
            raise Unfixable(f"{NO_STEP_REASON} ({problem})")
        if any(r.api not in (None, "initialize") for r in self.refs):
            raise Unfixable(NO_STEP_REASON)
        _check_min_torch(self)
        if self.spec.levels == {"O0"}:
            self.spec.add_enabled("False", None)  # O0 is fp32: a disabled scaler, autocast off in the class
        self.fp32 = False
        self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        self.access = _ObjectHome(self, owner, decision.scaler)
        self.scaler_scopes = [self.home]
        self._plan_presence_tests()
        self._plan_scaler_creation()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        classes = ", ".join(f"`{c}` ({index.relative(p)})" for p, c in decision.classes)
        return self._finish(
            f"Migrate apex.amp to torch.amp.GradScaler, set as `{owner}.{decision.scaler}` where `amp.initialize` was, "
            f"for the class owning `.{attribute}` that scales the loss: {classes}"
        )


class _ObjectHome(ScalerAccess):
    """`<object>.<scaler>`, made where `amp.initialize` was (the class's own default covers the
    paths that never get there, so the `if`s around the call are no condition of it)."""

    def __init__(self, planner: _Planner, owner: str, name: str) -> None:
        self.p = planner
        self.names = planner.names
        self.home = planner.home
        self.mode = "local"
        self.threaded: List[Scope] = []
        self.hoist_before = None
        self.detached_init = None
        self.default_init = None
        self.in_place = True
        self.enclosure = None
        self.else_default = None
        self.owner = owner
        self.name = name
        self.conditions = []
        for conjunct in planner.spec.enabled:
            if conjunct.code != "False" and not is_pure(cst.parse_expression(conjunct.code)):
                raise Unfixable("the `enabled` argument of `amp.initialize` has side effects")
            self.conditions.append((conjunct.code, conjunct.key))
        self.enabled_keys = frozenset(key for _, key in self.conditions)
        self.model_names = []

    def expression(self, node: cst.CSTNode) -> str:
        return f"{self.owner}.{self.name}"

    def home_expression(self) -> str:
        return f"{self.owner}.{self.name}"


# ---------------------------------------------------------------------------------- the class
class _OwnerSide(AttributeReadingSide):
    """The owning classes' methods read the scaler their `__init__` makes disabled and a script enables."""

    def _decide(self, facts) -> OwnedDecision:
        attributes = {a for a, _ in facts.apex_owned_optimizers.values()}
        if len(attributes) != 1:
            raise Unfixable(f"{NO_INIT_REASON} (the classes of this file scale with different optimizer attributes)")
        (attribute,) = attributes
        decision = decide_owned(self.ctx.project_index, attribute)
        if not decision.migrate:
            raise Unfixable(f"{NO_INIT_REASON} ({decision.reason})")
        problem, unsafe = group_check(self.ctx, attribute) if self.verify else (None, [])
        if problem is not None:
            raise Unfixable(f"{NO_INIT_REASON} ({problem})")
        self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        return decision

    def _reading_classes(self, facts):
        return facts.apex_owned_optimizers

    def _allowed(self, ref, facts) -> bool:
        """Also the class's own checkpoint: `amp.state_dict()` / `amp.load_state_dict(...)` in its methods."""
        if super()._allowed(ref, facts):
            return True
        scope = self._function_scope(ref.node)
        owner = scope.parent if scope.kind == "function" else None
        return (
            ref.api in ("state_dict", "load_state_dict") and owner is not None and owner.kind == "class"
            and owner.node.name.value in facts.apex_owned_optimizers
        )

    def _message(self, classes: List[str]) -> str:
        names = ", ".join(f"`{c}`" for c in classes)
        scripts = ", ".join(self.ctx.project_index.relative(p) for p in self.decision.scripts)
        return (
            f"Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler: {names} "
            f"{'make' if len(classes) > 1 else 'makes'} a disabled `self.{self.decision.scaler}` in "
            f"`__init__`, which {scripts} enables where it called `amp.initialize`; autocast is enabled when the "
            "scaler is"
        )

    def _scaler_access(self, scopes: List[Scope]):
        return _OwnedAccess(self, scopes)


class _OwnedAccess(_InheritedAccess):
    """`self.<scaler>` in the owning classes' methods, made disabled in their `__init__`."""

    def emit(self) -> None:
        cuda = self.p.ctx.string("cuda").value
        for cls in dict.fromkeys(self.p.readers):
            init = next(s for s in cls.node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__")
            if not isinstance(init.body, cst.IndentedBlock) or not init.params.params:
                raise Unfixable(f"{NO_INIT_REASON} (`{cls.node.name.value}.__init__` cannot make the scaler)")
            torch = self.p._torch(init)
            statement = self.p.ctx.parse_statement(
                f"{init.params.params[0].name.value}.{self.name} = {torch}.amp.GradScaler({cuda}, enabled=False)\n"
            )
            body = list(init.body.body)
            first = 1 if body and _is_docstring(body[0]) else 0
            if len(body) > first and _runs_base_init(body[first]):
                self.p.builder.insert_after(body[first], statement)  # an nn.Module's attributes after `Module.__init__`
            elif first:
                self.p.builder.insert_after(body[0], statement)
            else:
                self.p.builder.insert_before(_first_statement(init), statement)


def _runs_base_init(statement: cst.CSTNode) -> bool:
    """`super().__init__(...)`, `super(C, self).__init__(...)`, `Base.__init__(self, ...)`."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)):
        return False
    call = statement.body[0].value
    return (
        isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"
    )
