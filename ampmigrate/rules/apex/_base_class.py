"""Both sides of engine/apex_base_class.py's shape: apex set up by a base class of one file, the
loss scaled in the methods of its subclasses in other files.

- The base's file (`_BaseSide`): the in-file planner, whose setup has no scaled backward in the
  file; the scaler becomes `self.<scaler>` of the base class, made where `amp.initialize` was and
  before the `if`s around it (`enabled=` their condition), as for subclasses in the same file.
- A subclass's file (`_SubclassSide`): the in-file planner on the scaled backwards, the scaler
  read as `self.<scaler>`, autocast enabled as the scaler is (this file cannot know the base's
  opt level: the scaler carries it). Nothing else changes: the base's `__init__` runs first.

Every side asks `decide_base` (the index facts) and plans the others from the bytes the index read
(`_cross_threading._plan_elsewhere`): all migrate, with the same unsafe reasons, or none does.
"""

from __future__ import annotations

import os
from typing import List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.apex_base_class import BaseDecision, decide_base, setup_of, subclassed_elsewhere
from ampmigrate.engine.context import FileContext, FixBuilder
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import AmpPlan, Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, NO_STEP_REASON, _Planner
from ampmigrate.rules.apex._cross_threading import _check_min_torch, _ParameterAccess, _plan_elsewhere
from ampmigrate.rules.apex._scaler_access import ScalerAccess
from ampmigrate.rules.apex._trainer_class import _model_attributes


def base_class_planner(ctx: FileContext) -> Optional[_Planner]:
    """The planner of a setup class's file or of a subclass file, per the project index; None for
    any other file."""
    index = ctx.project_index
    facts = index.modules.get(os.path.abspath(ctx.path)) if index is not None else None
    if facts is None:
        return None
    if facts.apex_setup_classes:
        return _BaseSide(ctx)
    if facts.apex_subclass_steps and not facts.apex_step_functions:
        return _SubclassSide(ctx)
    return None


def group_check(ctx: FileContext, path: str, cls: str) -> Tuple[Optional[str], List[str]]:
    """(why the setup class `cls` of the file at `path` and its subclasses' files cannot migrate
    together or None, the unsafe reasons of the group). The same answer for every side."""
    index = ctx.project_index
    memo = index.__dict__.setdefault("_apex_base_group_checks", {})
    key = (os.path.abspath(path), cls)
    if key not in memo:
        decision = decide_base(index, path, cls)
        problem = None if decision.migrate else decision.reason
        unsafe: List[str] = []
        for member in (key[0], *(m for m, _ in decision.members)) if problem is None else ():
            reason, member_unsafe = _plan_elsewhere(ctx, member, base_class_planner)
            if reason is not None:
                problem = f"{index.relative(member)} cannot be migrated with it: {reason}"
                break
            unsafe.extend(u for u in member_unsafe if u not in unsafe)
        memo[key] = (problem, unsafe)
    return memo[key]


# ---------------------------------------------------------------------------------- A
class _BaseSide(_Planner):
    """The base class's `__init__` makes `self.<scaler>` where `amp.initialize` was."""

    verify = True  # plan the other files of the group too (not when planned from one of them)

    def _fix_without_steps(self, plan: AmpPlan) -> Optional[Fix]:
        cls = self.home.parent if self.home.kind == "function" else None
        facts = self.ctx.project_index.modules[os.path.abspath(self.ctx.path)]
        if (
            self.init.api != "initialize" or cls is None or cls.kind != "class"
            or cls.parent is not self.names.module_scope or cls.node.name.value not in facts.apex_setup_classes
        ):
            return super()._fix_without_steps(plan)
        name = cls.node.name.value
        decision = decide_base(self.ctx.project_index, self.ctx.path, name)
        if not decision.migrate and not subclassed_elsewhere(self.ctx.project_index, self.ctx.path, name):
            return super()._fix_without_steps(plan)  # no subclass of another file: not this shape
        if not decision.migrate:
            raise Unfixable(f"{NO_STEP_REASON} ({decision.reason})")
        problem, unsafe = group_check(self.ctx, self.ctx.path, name) if self.verify else (None, [])
        if problem is not None:
            raise Unfixable(f"{NO_STEP_REASON} ({problem})")
        if any(r.api not in (None, "initialize") for r in self.refs):
            raise Unfixable(NO_STEP_REASON)
        _check_min_torch(self)
        if self.spec.levels == {"O0"}:
            self.spec.add_enabled("False", None)  # O0 is fp32: a disabled scaler, autocast off in the subclasses
        self.fp32 = False
        self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        self.access = _InheritedHome(self, decision.scaler)
        if self.home.node.name.value != "__init__" and self.access.default_init is None:
            raise Unfixable(
                f"{NO_STEP_REASON} (`{name}.__init__` cannot make the disabled scaler that the instances which never "
                f"call `{self.home.node.name.value}()` read)"
            )
        self.scaler_scopes = [self.home]  # tests of apex's presence here become `self.scaler.is_enabled()`
        self._plan_presence_tests()
        self._plan_scaler_creation()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        where = ", ".join(
            f"`{c}` ({self.ctx.project_index.relative(m)})" for m, classes in decision.members for c in classes
        )
        made = f"`{name}.{self.home.node.name.value}()`"
        return self._finish(
            f"Migrate apex.amp to torch.amp.GradScaler, made as `self.{decision.scaler}` in {made} for its "
            f"subclasses {where} that scale the loss"
        )


class _InheritedHome(ScalerAccess):
    """`self.<scaler>` of the home class, whose users are subclasses in other files."""

    serves_other_files = True

    def __init__(self, planner: _Planner, name: str) -> None:
        self._decided = name
        super().__init__(planner, [])

    def _choose_name(self, use_scopes: List[Scope]) -> str:
        return self._decided  # free in every file of the group (engine/apex_base_class.py `_free_name`)


# ---------------------------------------------------------------------------------- B
class AttributeReadingSide(_Planner):
    """A file whose classes' methods scale losses with a GradScaler another file makes for them as
    `self.<scaler>` (the subclasses here; rules/apex/_owned_optimizer.py's owning classes): the
    in-file planner on the scaled backwards, nothing created here. Subclasses say who decides
    (`_decide`: the decision, its `scaler` the attribute), which classes may scale
    (`_reading_classes`) and the fix's message."""

    verify = True

    def _decide(self, facts):
        raise NotImplementedError

    def _reading_classes(self, facts):
        raise NotImplementedError

    def _message(self, classes: List[str]) -> str:
        raise NotImplementedError

    def _allowed(self, ref, facts) -> bool:
        return ref.api in (None, "scale_loss", "master_params")

    def _build(self, plan: AmpPlan) -> Fix:
        self._check_star_refs()
        self._check_unreached_uses()
        self._check_other_refs()
        facts = self.ctx.project_index.modules[os.path.abspath(self.ctx.path)]
        self.decision = self._decide(facts)
        for binding in self.usage.import_bindings:
            if self.ctx.reexported(binding):
                raise Unfixable(f"`{binding.name}` is re-exported from here; the modules that import it must be migrated first")
        if not all(self._allowed(r, facts) for r in self.refs):
            raise Unfixable(NO_INIT_REASON)
        _check_min_torch(self)
        self.fp32 = False
        self.spec = None
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        steps = [self._step(r) for r in self.refs if r.api == "scale_loss"]
        self.readers: List[Scope] = []
        for step in steps:
            cls = step.function.parent
            if cls is None or cls.kind != "class" or cls.parent is not self.names.module_scope:
                raise Unfixable(NO_INIT_REASON)
            if cls.node.name.value not in self._reading_classes(facts):
                raise Unfixable(NO_INIT_REASON)
            self.readers.append(cls)
        self._plan_fp16(steps)
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        return self._finish(self._message(list(dict.fromkeys(s.node.name.value for s in self.readers))))

    def _plan_scaler_creation(self) -> None:
        """The scaler is made in another file (or by `emit`)."""


class _SubclassSide(AttributeReadingSide):
    """The subclasses' methods read the scaler their base made."""

    def _decide(self, facts) -> BaseDecision:
        index = self.ctx.project_index
        decisions: List[BaseDecision] = []
        for name, record in facts.apex_subclass_steps.items():
            setup = setup_of(index, self.ctx.path, name)
            if setup is None:
                raise Unfixable(f"{NO_INIT_REASON} (`{name}` derives from `{record[1]}`, which sets no apex up in its `__init__`)")
            decision = decide_base(index, *setup)
            if not decision.migrate:
                raise Unfixable(f"{NO_INIT_REASON} ({decision.reason})")
            problem, unsafe = group_check(self.ctx, *setup) if self.verify else (None, [])
            if problem is not None:
                raise Unfixable(f"{NO_INIT_REASON} ({problem})")
            decisions.append(decision)
            self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        if len({d.scaler for d in decisions}) != 1:
            raise Unfixable(f"{NO_INIT_REASON} (the base classes of this file's subclasses name the scaler differently)")
        return decisions[0]

    def _reading_classes(self, facts):
        return facts.apex_subclass_steps

    def _message(self, classes: List[str]) -> str:
        names = ", ".join(f"`{c}`" for c in classes)
        return (
            f"Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler: {names} "
            f"{'read' if len(classes) > 1 else 'reads'} the GradScaler "
            f"`self.{self.decision.scaler}` that the base class makes where `amp.initialize` was; "
            "autocast is enabled when the scaler is"
        )

    def _scaler_access(self, scopes: List[Scope]):
        return _InheritedAccess(self, scopes)


class _InheritedAccess(_ParameterAccess):
    """`self.<scaler>` in the subclasses' methods; nothing to add to any signature."""

    def __init__(self, planner: _SubclassSide, scopes: List[Scope]) -> None:
        self.p = planner
        self.name = planner.decision.scaler
        self.model = getattr(planner.decision, "model", "")  # the base's model attribute, when a base set apex up
        # set by the base class in its own file, so no binding here shows it (rules/apex/_amp_forward.py)
        self.inherited_attributes = frozenset({self.model} if self.model else ())
        self.threaded: List[Scope] = []
        self.hoist_before = None
        self.enabled_keys = frozenset()
        self.conditions = []
        self.scopes = list(dict.fromkeys(scopes))

    def expression(self, node: cst.CSTNode) -> str:
        func = self.p._function_scope(node).node
        if not isinstance(func, cst.FunctionDef) or not func.params.params:
            raise Unfixable(f"{NO_INIT_REASON} (a method without `self` scales a loss)")
        return f"{func.params.params[0].name.value}.{self.name}"

    def autocast_enabled(self, at: cst.CSTNode) -> Optional[str]:
        return f"{self.expression(at)}.is_enabled()"  # the base's opt level and condition, carried by the scaler

    def model_keys(self, function: Scope, depth: int = 0) -> Set[str]:
        """The instance attributes named like a model that the subclass reads, and the one the
        base class handed to `amp.initialize`."""
        keys: Set[str] = set()
        if function.parent is not None and function.parent.kind == "class":
            keys = _model_attributes(function.parent)
        return keys | {f"self.{self.model}"} if self.model else keys

    def emit(self) -> None:
        """The base class's `__init__` made the scaler: the subclasses change nothing else."""
