"""apex.amp split across two files: one GradScaler threaded from `amp.initialize` to `scale_loss`.

File A: `model, optimizer = amp.initialize(model, optimizer, opt_level=...)` in a function, then
`do_train(model, ..., optimizer, ...)` imported from module B. File B: `do_train` runs
`with amp.scale_loss(losses, optimizer) as s: s.backward()` and `optimizer.step()` on its own
`from apex import amp`. The migration:

- A: `scaler = torch.amp.GradScaler("cuda", ...)` where `initialize` was, with the `enabled` the
  in-file fix computes from the opt level and the `if`s around it (`_amp_options.scaler_spec`,
  `_scaler_access`; O0 alone gives `enabled=False`), and `scaler=scaler` passed to each call;
- B: a new `scaler` parameter, `scaler.scale(loss).backward()`, `scaler.step(optimizer)` +
  `scaler.update()`, the forward pass and loss under `torch.autocast("cuda",
  dtype=torch.float16, enabled=scaler.is_enabled())` (B cannot know A's opt level: the scaler
  carries it).

Both files are fixed by independent runs; each side asks `engine/apex_threading.decide` (the
same index facts) and migrates only when the pair does. The planner is the in-file one
(`_amp_migration._Planner`) with the scaler's home replaced: a parameter in B, a local passed on
in A.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.api import TORCH_AMP_GRAD_SCALER_SINCE, format_version
from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.apex_threading import Decision, decide, initializer_targets, step_spellings
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import AmpPlan, Unfixable
from ampmigrate.rules.apex._amp_migration import (
    NO_INIT_REASON,
    NO_STEP_REASON,
    _Planner,
)
from ampmigrate.rules.apex._input_gradient_threading import is_input_gradient
from ampmigrate.rules.apex._other_files import fix_problem
from ampmigrate.rules.apex._scaler_access import ScalerAccess, add_parameter
from ampmigrate.source import SourceError, SourceFile


def group_check(ctx: FileContext, path: str, function: str) -> Tuple[Optional[str], List[str]]:
    """(why the group of `function` in the file at `path` (B) and its callers (A) cannot migrate
    together or None, why its migration is unsafe). First `decide` (the index facts); then every
    file of the group is planned from the bytes the index read before any fix: a side whose own
    plan stops (a shape the facts do not see) stops the others, and an unsafe side (what its
    `amp.initialize` asks for) makes every fix of the group unsafe. Each side asks, and gets the
    same answer."""
    index = ctx.project_index
    memo = index.__dict__.setdefault("_apex_group_checks", {})
    key = (os.path.abspath(path), function)
    if key not in memo:
        decision = decide(index, path, function)
        problem = None if decision.migrate else decision.reason
        unsafe: List[str] = []
        # An input gradient's callers scale their own losses: the in-file planner is theirs.
        gradient = function in index.modules[key[0]].apex_gradient_functions
        factory = _side_or_in_file if gradient else None
        for member in (key[0], *decision.caller_paths) if problem is None else ():
            reason, member_unsafe = _plan_elsewhere(ctx, member, factory)
            if reason is not None:
                problem = f"{index.relative(member)} cannot be migrated with it: {reason}"
                break
            unsafe.extend(u for u in member_unsafe if u not in unsafe)
        memo[key] = (problem, unsafe)
    return memo[key]


def _plan_elsewhere(ctx: FileContext, path: str, factory=None) -> Tuple[Optional[str], List[str]]:
    """(why the split planner (or `factory`'s) finds no fix for the file at `path`, as the index
    read it; what makes its fix unsafe)."""
    index = ctx.project_index
    source = index.apex_sources.get(path)
    if source is None:
        return "its text was not read", []
    try:
        text = SourceFile.from_bytes(path, source[1]).text
        module = cst.parse_module(text)
        other = FileContext(path, text, module, ctx.settings)
    except (SourceError, cst.ParserSyntaxError, RecursionError):
        return "it does not parse", []
    other.project_index = index
    other.imported_elsewhere = frozenset(index.imported_from(path))
    other.imports_scanned = ctx.imports_scanned
    planner = (factory or split_planner)(other)
    if planner is None:
        return "it is not a side of this setup", []
    planner.verify = False
    plan = planner.plan()
    if plan.fix is None:
        return plan.reason or "nothing to migrate", []
    problem = fix_problem(other, plan.fix)
    if problem is not None:
        return problem, []
    return None, list(planner.unsafe)


def _side_or_in_file(ctx: FileContext) -> _Planner:
    return split_planner(ctx) or _Planner(ctx)


def split_planner(ctx: FileContext) -> Optional[_Planner]:
    """The planner for a file that is one side of a split apex setup, per the project index;
    None for any other file (the in-file planner's)."""
    index = ctx.project_index
    if index is None:
        return None
    facts = index.modules.get(os.path.abspath(ctx.path))
    if facts is None:
        return None
    if facts.apex_step_functions:
        return _StepSide(ctx)
    if facts.apex_init_function:
        targets, _ = initializer_targets(index, ctx.path)
        if targets:
            return _InitSide(ctx)
    return None


# ---------------------------------------------------------------------------------- B
def threaded_function(scope: Scope) -> Scope:
    """The function that takes the scaler for a step in `scope`: `scope` itself, or, for a closure
    (ignite's `def update_fn(engine, batch)` inside `create_trainer(model, optimizer, ...)`, handed
    to `Engine` and called with its arguments), the function enclosing it, whose parameter the
    closure reads. The index summarizes the outer function (`ast.walk` reaches the closure)."""
    while scope.kind == "function" and scope.parent is not None and scope.parent.kind == "function":
        scope = scope.parent
    return scope


class _StepSide(_Planner):
    """B: the functions scaling the loss get the scaler as a new parameter."""

    verify = True  # plan the other files of the group too (not when planned from one of them)

    def _build(self, plan: AmpPlan) -> Fix:
        self._check_star_refs()
        self._check_unreached_uses()
        self._check_other_refs()
        index = self.ctx.project_index
        facts = index.modules[os.path.abspath(self.ctx.path)]
        self.decisions: Dict[str, Decision] = {}
        for name in facts.apex_step_functions:
            decision = decide(index, self.ctx.path, name)
            if not decision.migrate:
                raise Unfixable(f"{NO_INIT_REASON} ({decision.reason})")
            problem, unsafe = group_check(self.ctx, self.ctx.path, name) if self.verify else (None, [])
            if problem is not None:
                raise Unfixable(f"{NO_INIT_REASON} ({problem})")
            self.decisions[name] = decision
            # A caller's migration is unsafe (its `amp.initialize` options): so is this side's.
            self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        for binding in self.usage.import_bindings:
            if self.ctx.reexported(binding):
                raise Unfixable(f"`{binding.name}` is re-exported from here; the modules that import it must be migrated first")
        if any(r.api not in (None, "scale_loss", "master_params") for r in self.refs):
            raise Unfixable(NO_INIT_REASON)
        _check_min_torch(self)
        self.fp32 = False
        self.spec = None
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        steps = [self._step(r) for r in self.refs if r.api == "scale_loss"]
        self.trainer_classes: List[Scope] = []
        for step in steps:
            owner = threaded_function(step.function)
            if owner.parent is not None and owner.parent.kind == "class":  # a trainer class's method
                from ampmigrate.rules.apex._trainer_class import trainer_class

                owner = trainer_class(self, step.function)
                self.trainer_classes.append(owner)
            name = getattr(owner.node, "name", None)
            if name is None or name.value not in self.decisions or owner.parent is not self.names.module_scope:
                raise Unfixable(NO_INIT_REASON)
        self._plan_fp16(steps)
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        names = ", ".join(f"`{n}()`" for n in self.decisions)
        callers = sorted({c for d in self.decisions.values() for c in d.callers})
        stored = f" (stored as `self.{self.access.name}`)" if self.trainer_classes else ""
        return self._finish(
            f"Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler: {names} "
            f"{'take' if len(self.decisions) > 1 else 'takes'} the GradScaler "
            f"that {', '.join(callers)} creates where `amp.initialize` was, as a new `{self.access.name}` parameter"
            f"{stored}; autocast is enabled when the scaler is"
        )

    def _plan_step_calls(self, step, all_steps) -> None:
        """An input gradient's helper steps nothing (engine/apex_input_gradients.py)."""
        name = getattr(step.function.node, "name", None)
        if name is not None and is_input_gradient(self, name.value):
            step.steps = []
            return
        super()._plan_step_calls(step, all_steps)

    def _scaler_access(self, scopes: List[Scope]) -> ScalerAccess:
        if self.trainer_classes:
            from ampmigrate.rules.apex._trainer_class import TrainerAccess

            return TrainerAccess(self, scopes, self.trainer_classes)
        return _ParameterAccess(self, scopes)

    def _plan_scaler_creation(self) -> None:
        """The scaler is made in the caller's file."""


class _ParameterAccess:
    """The scaler as a new parameter of each step function (the ScalerAccess interface)."""

    mode = "parameter"

    def __init__(self, planner: _StepSide, scopes: List[Scope]) -> None:
        self.p = planner
        self.threaded: List[Scope] = []
        self.hoist_before = None
        self.enabled_keys = frozenset()
        self.conditions = []
        self.scopes = list(dict.fromkeys(threaded_function(s) for s in scopes))
        names = {d.scaler for d in planner.decisions.values()}
        if len(names) != 1:
            raise Unfixable("the step functions of this file would take the scaler under different names")
        self.name = names.pop()

    def expression(self, node: cst.CSTNode) -> str:
        return self.name

    def home_expression(self) -> str:
        return self.name

    def creation_enabled(self) -> Optional[str]:
        return None

    def autocast_enabled(self, at: cst.CSTNode) -> Optional[str]:
        if self._optional(self.p._function_scope(at)):  # called without it too: fp32 there
            return f"{self.name} is not None and {self.name}.is_enabled()"
        return f"{self.name}.is_enabled()"  # the caller's opt level, carried by the scaler

    def _optional(self, scope: Scope) -> bool:
        """`scope` is an input gradient's helper, whose scaler defaults to None."""
        name = getattr(scope.node, "name", None)
        return name is not None and is_input_gradient(self.p, name.value)

    def model_keys(self, function: Scope, depth: int = 0):
        """The parameters named like a model (`model`, `net`, `generator_model`): what the caller
        passes its model in. A call of another parameter still looks like a forward pass (the
        planner's `_forward_like_test`)."""
        params = []
        for scope in dict.fromkeys((function, threaded_function(function))):  # a closure reads the outer's
            node = scope.node
            if isinstance(node, cst.FunctionDef):
                params += [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        return {p for p in params if "model" in p.lower() or "net" in p.lower()}

    def emit(self) -> None:
        for scope in self.scopes:
            func = scope.node
            self.p.builder.replace(func.params, add_parameter(func.params, self.name, optional=self._optional(scope)))
        self._emit_relays()

    def _emit_relays(self) -> None:
        """A function relaying the optimizer to a step function (engine/apex_threading._relay)
        takes the scaler too, and hands it on in each call: `train_epoch(..., scaler=scaler)`."""
        facts = self.p.ctx.project_index.modules[os.path.abspath(self.p.ctx.path)]
        functions = {s.name.value: s for s in self.p.module.body if isinstance(s, cst.FunctionDef)}
        for callee, caller in facts.apex_step_relays.items():
            if caller not in self.p.decisions or caller not in functions:
                raise Unfixable(f"`{caller}()`, which hands the optimizer to `{callee}()`, is not a top-level function here")
            func = functions[caller]
            self.p.builder.replace(func.params, add_parameter(func.params, self.name))
            for call in walk(func.body):
                if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == callee:
                    arg = cst.Arg(
                        cst.Name(self.name),
                        keyword=cst.Name(self.name),
                        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
                    )
                    self.p.builder.replace(call, rebuild_args(call, [*call.args, arg]))


# ---------------------------------------------------------------------------------- A
class _InitSide(_Planner):
    """A: the scaler is created where `amp.initialize` was and passed to the step functions."""

    verify = True

    def _threads_scaler_out(self) -> bool:
        return True

    def _split_fix(self, plan: AmpPlan) -> Fix:
        index = self.ctx.project_index
        targets, reason = initializer_targets(index, self.ctx.path)
        if reason is not None or not targets:
            raise Unfixable(f"{NO_STEP_REASON} ({reason or 'no function of the run scales its loss'})")
        # The setup's own checkpoint (`amp.state_dict()` saved beside the model's) reads the scaler
        # made here; any other use of apex's amp in this file is not this shape.
        states = [r for r in self.refs if r.api in ("state_dict", "load_state_dict")]
        if any(r.api not in (None, "initialize", "state_dict", "load_state_dict", "save_entry") for r in self.refs) or any(
            self._function_scope(r.node) is not self.home for r in states
        ):
            raise Unfixable(NO_STEP_REASON)
        (other, callee), = targets
        decision = decide(index, other, callee)
        problem, unsafe = group_check(self.ctx, other, callee) if self.verify else (None, [])
        if problem is not None:
            raise Unfixable(f"{NO_STEP_REASON} ({problem})")
        if self.home.kind != "module" and (self.home.kind != "function" or self.home.parent is not self.names.module_scope):
            raise Unfixable(NO_STEP_REASON)
        _check_min_torch(self)
        # `do_train(...)`, `trainer.do_train(...)`, `T.do_train(...)`: as this file spells it
        spellings = {
            spelled for spelled, pair in step_spellings(index, os.path.abspath(self.ctx.path)).items() if pair == (other, callee)
        }  # through a package re-exporting it too
        self.calls = [
            node for node in walk(self.home.node) if isinstance(node, cst.Call) and _spelled(node.func) in spellings
        ]
        if not self.calls or any(self._function_scope(c) is not self.home for c in self.calls):
            where = f"`{self.home.node.name.value}()`" if self.home.kind == "function" else "the module's top level"
            raise Unfixable(f"{NO_STEP_REASON} (a call of the training function is not in {where})")
        if self.spec.levels == {"O0"}:
            self.spec.add_enabled("False", None)  # O0 is fp32: a disabled scaler, autocast off in the callee
        self.fp32 = False
        # Its own unsafe reasons (the planner took them from the spec), and the other callers'
        # (every fix of the group is unsafe alike).
        self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        self.access = _InitAccess(self, [])
        self.scaler_scopes = [self.home]  # tests of apex's presence here become `scaler.is_enabled()`
        from ampmigrate.rules.apex._checkpoint_threading import (
            helper_calls,
            pass_scaler,
        )

        helpers = helper_calls(self)  # checkpoint helpers (engine/apex_checkpoint.py)
        if any(self._function_scope(call) is not self.home for call, _, _ in helpers):
            raise Unfixable(f"{NO_STEP_REASON} (a checkpoint helper is called outside the function calling `amp.initialize`)")
        self._plan_presence_tests()
        self._plan_scaler_creation()
        for call in self.calls:
            keyword = decision.scaler
            arg = cst.Arg(
                cst.Name(self.access.name),
                keyword=cst.Name(keyword),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            )
            self.builder.replace(call, rebuild_args(call, [*call.args, arg]))
            self.handled.add(call)
        pass_scaler(self, helpers)
        if states:
            self._plan_simple_refs()  # `scaler.state_dict()`, the guarded `scaler.load_state_dict(x)`
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        where = ", ".join(f"`{callee}()` ({index.relative(other)})" for other, callee in targets)
        return self._finish(f"Migrate apex.amp to torch.amp.GradScaler, passed to {where} that scales the loss")


class _InitAccess(ScalerAccess):
    """The in-file local scaler, whose uses are the calls it is passed to (so that `enabled`
    covers the `if`s around `amp.initialize` that those calls do not share)."""

    def _home_uses(self) -> List[cst.CSTNode]:
        return list(self.p.calls)


def _spelled(node: cst.BaseExpression) -> str:
    """`save_checkpoint`, `utils.save_checkpoint`: a callee as the index's caller facts spell it ("" otherwise)."""
    parts: List[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return ""
    parts.append(node.value)
    return ".".join(reversed(parts))


def _check_min_torch(planner: _Planner) -> None:
    settings = planner.ctx.settings
    if settings.min_torch < TORCH_AMP_GRAD_SCALER_SINCE:
        raise Unfixable(
            f"the fix needs `torch.amp.GradScaler` (torch >= {format_version(TORCH_AMP_GRAD_SCALER_SINCE)}); "
            f"min-torch is {format_version(settings.min_torch)}"
        )
