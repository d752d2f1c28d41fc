"""The apex.amp migration of one file, planned once and shared by AMP101-AMP104.

A partial apex migration leaves code that does not run, so everything the file does with
apex.amp changes in one fix: `amp.initialize` becomes a `torch.amp.GradScaler`, each
`with amp.scale_loss(loss, opt) as s: s.backward()` becomes `scaler.scale(loss).backward()`, the
`opt.step()` after it `scaler.step(opt)` + `scaler.update()`, gradient reads between the two
(a clip, `amp.master_params`) get `scaler.unscale_(opt)` first, the forward pass and loss go under
`torch.autocast("cuda", dtype=torch.float16)`, `amp.state_dict()` / `amp.load_state_dict()` move
to the scaler, and the apex import goes. Under O0 (fp32) the same uses become plain fp32 code.

The parts: `_scaler_access` (where the scaler lives and how each use spells it), `_amp_steps`
(the optimizer step and `unscale_`), `_amp_forward` and `_regions` (the autocast regions),
`_amp_options` (what `amp.initialize`'s arguments ask for), `_presence` (tests of whether apex
imported) and `_removal` (the imports that go). This module reads the file's apex.amp use
(`_amp_refs`), checks its shape and puts the fix together.

Anything the plan cannot follow stops it with a reason (`Unfixable`); the findings are then
reported without a fix.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import (
    Branch,
    body_of,
    branches,
    condition_code,
    expression_key,
    indent_continuations,
    is_main_guard,
    is_pure,
    walk,
)
from ampmigrate.api import (
    APEX_AMP_CAST_ANNOTATIONS,
    TORCH_AMP_GRAD_SCALER_SINCE,
    format_version,
)
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.context import FileContext, FixBuilder
from ampmigrate.engine.names import Binding, Scope
from ampmigrate.rules.apex._accumulation_clip import AccumulationClips
from ampmigrate.analysis.bool_flags import bool_names
from ampmigrate.rules.apex._amp_carrier import check_stores, emit_stores
from ampmigrate.rules.apex._init_enclosure import reads_of, stores_in
from ampmigrate.rules.apex._amp_common import (
    CODE,
    HANDLE_CODE,
    O0_CODE,
    O3_CODE,
    AmpPlan,
    Site,
    Step,
    Unfixable,
    plain_optimizer,
)
from ampmigrate.rules.apex._amp_forward import ForwardRegions, with_lines_replaced
from ampmigrate.rules.apex._keyword_dict import expanded as expanded_keywords
from ampmigrate.rules.apex._amp_options import (
    INITIALIZE_PARAMS,
    Guard,
    bound_arguments,
    is_no_optimizers,
    scaler_spec,
)
from ampmigrate.rules.apex._amp_refs import AmpRef, amp_usage
from ampmigrate.rules.apex._amp_steps import StepRewrites
from ampmigrate.rules.apex._caller_forward import CallerForward
from ampmigrate.rules.apex._delayed_micro_steps import DelayedMicroSteps
from ampmigrate.rules.apex._hf_apex_arms import library_apex_arms_fix
from ampmigrate.rules.apex._import_sequencing import claim_other_uses
from ampmigrate.rules.apex._loop_helper_steps import LoopHelperSteps
from ampmigrate.rules.apex._method_windows import MethodWindows
from ampmigrate.rules.apex._multi_init import MORE_THAN_ONCE, MultiInits
from ampmigrate.rules.apex._threaded_importers import check_threaded_importers
from ampmigrate.rules.apex._optimizer_loops import OptimizerLoops
from ampmigrate.rules.apex._presence import (
    Action,
    Unsupported,
    choose,
    presence_action,
    simplify,
    unwrap,
)
from ampmigrate.rules.apex._checkpoint_entries import plan_checkpoint_entry
from ampmigrate.rules.apex._regions import NoRegion, Region, autocast_regions
from ampmigrate.rules.apex._removal import Removal, none_assignments, unused_after
from ampmigrate.rules.apex._scaler_access import ScalerAccess
from ampmigrate.rules.apex._state_load_guard import GUARD_NOTE, guard_state_load
from ampmigrate.rules.apex._state_loader_args import plan_state_loader_arg
from ampmigrate.rules.apex._passed_training import plan_train_param_arg
from ampmigrate.rules.apex._state_params_elsewhere import plan_state_param_arg
from ampmigrate.rules.apex._timm_scaler import timm_scaler_fix
from ampmigrate.rules.apex._unused_optimizer import optimizer_never_read, optimizers_unused
from ampmigrate.rules.apex._window_readers import WindowReaders

__all__ = ["AmpPlan", "Site", "amp_plan"]

SCALE_LOSS_PARAMS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")


NO_INIT_REASON = (
    "`amp.initialize` is not called in this file: the GradScaler has to be created where it is and passed here"
)
NO_STEP_REASON = (
    "`amp.scale_loss` is not used in this file (the training step is elsewhere): create the "
    '`torch.amp.GradScaler("cuda")` here and pass it to the code that scales the loss'
)


def amp_plan(ctx: FileContext) -> AmpPlan:
    return ctx.shared("apex.amp_plan", lambda: _planner_for(ctx).plan())


def _planner_for(ctx: FileContext) -> "_Planner":
    # A file that is one side of an apex setup split across two files (_cross_threading.py).
    from ampmigrate.rules.apex._base_class import base_class_planner
    from ampmigrate.rules.apex._checkpoint_threading import checkpoint_planner
    from ampmigrate.rules.apex._cross_threading import split_planner
    from ampmigrate.rules.apex._owned_optimizer import owned_planner
    from ampmigrate.rules.apex._setup_helper import setup_helper_planner

    return (
        setup_helper_planner(ctx) or split_planner(ctx) or base_class_planner(ctx) or owned_planner(ctx)
        or checkpoint_planner(ctx) or _Planner(ctx)
    )


# A GradScaler call longer than this goes one argument a line (black's default width is 88; the
# scaler's usual `enabled=` conditions fit on one line under 100).
_LINE_LENGTH = 100


def _atomic(code: str) -> bool:
    """`bool(args.fp16)`, `args.fp16`: an operand of `and` as it is."""
    try:
        node = ast.parse(code.strip(), mode="eval").body
    except SyntaxError:
        return False
    return isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))


def _distinct_tests(codes: List[str]) -> List[str]:
    """The tests, each once (`x != "O0"` and `x != 'O0'` are one test)."""
    seen: Dict[str, str] = {}
    for code in codes:
        try:
            key = ast.dump(ast.parse(code.strip(), mode="eval"))
        except SyntaxError:
            key = code
        seen.setdefault(key, code)
    return list(seen.values())


class _Planner(
    StepRewrites, MethodWindows, AccumulationClips, ForwardRegions, MultiInits, LoopHelperSteps, WindowReaders, OptimizerLoops,
    CallerForward, DelayedMicroSteps,
):
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.module = ctx.module
        self.builder: Optional[FixBuilder] = None
        self.handled: Set[cst.CSTNode] = set()  # nodes the fix replaces or removes
        self.removal = Removal(self.names)
        self.notes: List[str] = []
        self.unsafe: List[str] = []
        self.star_users_keep: Set[Binding] = set()  # module-level apex imports other files still read via `*`
        self._init_windows()

    # ------------------------------------------------------------------ entry
    def plan(self) -> AmpPlan:
        usage = amp_usage(self.ctx)
        refs = [r for r in usage.refs if r.api not in APEX_AMP_CAST_ANNOTATIONS]
        plan = AmpPlan()
        for ref in refs:
            if ref.api in (None, "pass", "carry", "state_arg", "state_pass", "train_pass", "save_entry") or (
                ref.via_handle and ref.api == "handle"
            ):
                continue  # presence tests, the module handed on or stored and the handle are not findings
            api = ref.node.attr.value if ref.api == "unknown" and isinstance(ref.node, cst.Attribute) else ref.api
            plan.sites.append(Site(ref.node, self._code_for(ref), api))
        if not plan.sites:
            # Imported (maybe tested for) but never used: the import is the finding.
            cast_refs = any(r.api in APEX_AMP_CAST_ANNOTATIONS for r in usage.refs)
            if not usage.import_bindings or cast_refs:
                return plan
            if any(self.ctx.reexported(b) for b in usage.import_bindings):
                return plan  # handed on to other modules: AMP111 reports the import line
            plan.sites.append(Site(usage.import_bindings[0].node, CODE, "import"))
        self.usage = usage
        self.refs = refs
        try:
            # apex set up by transformers, not by this project (_hf_apex_arms.py), else this file's setup
            plan.fix = library_apex_arms_fix(self, plan.sites) or self._build(plan)
        except Unfixable as exc:
            plan.reason = str(exc)
        return plan

    def _code_for(self, ref: AmpRef) -> str:
        if ref.via_handle or ref.api == "init":
            return HANDLE_CODE
        if ref.api == "initialize" and ref.call is not None:
            levels = scaler_spec(self.module, self.names, ref.call, self.ctx.quote).levels
            if levels == {"O3"}:
                return O3_CODE
            if levels == {"O0"}:
                return O0_CODE
        return CODE

    # ------------------------------------------------------------------ the fix
    def _build(self, plan: AmpPlan) -> Fix:
        """The pipeline, top to bottom: the file's apex use must have a shape the fix follows;
        one `amp.initialize` is the setup (or an early fix: no setup, inference only, one per
        function); its options decide fp16 or fp32 and where the scaler lives; each scaled
        backward is planned (the mixins: steps, unscale points, clips, autocast regions); the
        edits are emitted last (imports, removals) and checked to nest."""
        self._check_shape()
        chosen = self._choose_setup(plan)
        if isinstance(chosen, Fix):
            return chosen
        self._enter_setup(plan, *chosen)
        steps = [self._step(r) for r in self.refs if r.api in ("scale_loss", "handle.scale_loss")]
        early = None if steps else self._fix_without_steps(plan)
        if early is not None:
            return early
        self._check_scaled_elsewhere()
        if self.fp32:
            self._plan_fp32(steps)
        else:
            self._plan_fp16(steps)
            self._check_half_inputs(steps)  # _multi_init.py
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        kind = "fp32 (O0)" if self.fp32 else "torch.autocast fp16 and torch.amp.GradScaler"
        return self._finish(f"Migrate apex.amp to {kind}")

    def _check_scaled_elsewhere(self) -> None:
        """Calls handing the optimizer `amp.initialize` returned to a function of another file
        that scales a loss with apex's amp with it: an input gradient's helper (fast adversarial
        training's `attack_pgd(..., opt)` of utils.py) then takes the GradScaler made here
        (`self.gradient_calls`, passed in `_plan_fp16`); any other stops the plan
        (_input_gradient_threading.py)."""
        from ampmigrate.rules.apex._input_gradient_threading import gradient_calls

        self.gradient_calls = gradient_calls(self, self._initialized_optimizers())
        if self.gradient_calls and self.fp32:
            call, (_, function), _ = self.gradient_calls[0]
            raise Unfixable(
                f"line {self._line(call)} hands the optimizer to `{function}()` of another file, which scales a "
                "loss with apex's amp; under O0 no GradScaler is made here to hand it"
            )

    def _initialized_optimizers(self) -> Set[str]:
        """The names the `amp.initialize` calls of the file bind their optimizer to (`model, opt = ...`)."""
        found: Set[str] = set()
        for ref in self.refs:
            if ref.api != "initialize" or ref.call is None:
                continue
            assign = self.names.parent(ref.call)
            if isinstance(assign, cst.Assign) and assign.value is ref.call:
                for target in assign.targets:
                    if isinstance(target.target, (cst.Tuple, cst.List)) and len(target.target.elements) > 1:
                        last = target.target.elements[-1].value
                        if isinstance(last, cst.Name):
                            found.add(last.value)
        return found

    def _check_shape(self) -> None:
        """Uses of apex's amp the fix cannot follow stop the plan first."""
        self._check_star_refs()
        self._check_unreached_uses()
        for binding in self.usage.import_bindings:
            if self.ctx.reexported(binding):
                raise Unfixable(
                    f"`{binding.name}` is re-exported from here (`__all__` or a package `__init__`); the modules "
                    "that import it must be migrated first"
                )
        self._check_star_users()
        self._check_other_refs()
        self._check_forwarding_wrappers()

    def _check_forwarding_wrappers(self) -> None:
        """A function handing its own `*args`/`**kwargs` on to apex (`def initialize(models,
        optimizers, *args, **kwargs): return amp.initialize(models, optimizers, *args, **kwargs)`, a
        project's apex facade) wraps apex for its callers, who choose the options and use the
        result: the migration is theirs, and the reason says so."""
        for ref in self.refs:
            if ref.call is None:
                continue
            function = self._function_scope(ref.call).node
            if not isinstance(function, cst.FunctionDef):
                continue
            params = function.params
            stars = {
                p.name.value for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)
            }
            forwarded = [
                a.value.value for a in ref.call.args
                if a.star and isinstance(a.value, cst.Name) and a.value.value in stars
            ]
            if forwarded:
                raise Unfixable(
                    f"`{self.ctx.code(ref.call.func)}` at line {self._line(ref.call)} is given the "
                    f"`{'`, `'.join(forwarded)}` of `{function.name.value}()`, which wraps apex's amp for its "
                    "callers (they choose the options and use the result): migrate the callers to torch.amp, "
                    "then this wrapper goes"
                )

    def _choose_setup(self, plan: AmpPlan):
        """(the `amp.initialize` the fix migrates, what its options ask for), or the whole fix
        where the file's calls need no single setup."""
        inits = [r for r in self.refs if r.api in ("initialize", "init")]
        if not inits:
            if any(r.api not in (None, "disable_casts", "master_params") for r in self.refs):
                raise Unfixable(NO_INIT_REASON)
            return self._standalone_fix(plan)
        if len(inits) > 1:
            inits = self._without_init_beside_initialize(inits)
        if len(inits) > 1:
            inits = self._without_inference_inits(inits)
        if len(inits) > 1:
            inits = self._without_o0_arms(inits)  # _multi_init.py
        if len(inits) > 1 and self._all_inference(inits):
            return self._inference_fixes(plan, inits)  # _multi_init.py
        if len(inits) > 1:
            try:
                inits = self._without_reinitializations(inits)
            except Unfixable as exc:
                return self._per_function_fix(plan, inits, exc)  # _multi_init.py: or its precise reason
        init = inits[0]
        if init.call is None:
            raise Unfixable(f"`{self.ctx.code(init.node)}` is used without being called")
        spec = scaler_spec(self.module, self.names, init.call, self.ctx.quote, handle_api=init.api == "init")
        plan.levels = spec.levels
        if spec.error:
            raise Unfixable(f"`amp.initialize`: {spec.error}")
        if spec.levels == {"O3"} and spec.optimizers is None:
            raise Unfixable(
                "O3 without optimizers (inference) cast the model to fp16 and patched its `forward` to cast "
                "floating inputs to fp16 and outputs to fp32; torch.amp has no such mode: `model.half()` with "
                "those casts by hand, or fp16 autocast over the fp32 model, is your choice"
            )
        if spec.levels == {"O3"}:
            raise Unfixable(
                "O3 is pure fp16 training (the model cast to half, no fp32 master weights, no loss scaling); "
                "torch.amp has no such mode, so the choice (fp16 autocast + GradScaler, or bf16) is yours"
            )
        if "O3" in spec.levels and spec.o3_test is None and spec.opt_level_code is None:
            raise Unfixable("`opt_level` may be O3 (pure fp16), which has no torch.amp equivalent")
        fp32 = spec.levels == {"O0"}
        if not fp32 and self.ctx.settings.min_torch < TORCH_AMP_GRAD_SCALER_SINCE:
            raise Unfixable(
                f"the fix needs `torch.amp.GradScaler` (torch >= {format_version(TORCH_AMP_GRAD_SCALER_SINCE)}); "
                f"min-torch is {format_version(self.ctx.settings.min_torch)}"
            )
        if init.api == "initialize" and not fp32 and (spec.optimizers is None or optimizers_unused(self, init)):
            return self._inference_fix(plan, init, spec)  # (an optimizer nothing reads again: _unused_optimizer.py)
        return init, spec

    def _enter_setup(self, plan: AmpPlan, init: AmpRef, spec) -> None:
        """The fix's builder, and where `amp.initialize` was: the scaler's home (and its guards: O3, run-time options)."""
        fp32 = spec.levels == {"O0"}
        self.fp32 = fp32
        self.spec = spec
        self.unsafe.extend(spec.unsafe)
        self.notes.extend(spec.notes)
        self.setup_guards: List[str] = []
        guards = [] if fp32 else list(spec.guards)
        if spec.o3_test is not None and not fp32:
            # O0/O1/O2 keep their meaning (the scaler is disabled under O0); O3 would silently train
            # another way, so it stops with an error where `amp.initialize` ran instead.
            guards.insert(0, Guard(spec.o3_test, "apex opt_level O3 (pure fp16) has no torch.amp equivalent; use O1 or O2", spec.o3_unsafe))
        for guard in guards:
            self.unsafe.remove(guard.resolves)
        self.setup_guards = [f"if {g.test}:\n    raise ValueError({self.ctx.string(g.message).value})" for g in guards]
        if spec.o3_test is not None and not fp32:
            self._note(
                f"`opt_level={spec.opt_level_code}` is known only at run time: O0 disables the scaler and autocast, O1 and "
                "O2 run fp16 autocast, and O3 (pure fp16, which torch.amp cannot do) now raises where `amp.initialize` was"
            )
        for guard in spec.guards if not fp32 else ():
            self._note(f"{guard.resolves}: the values autocast matches migrate, the others now raise where `amp.initialize` was")
        requires = {s.code for s in plan.sites}
        self.builder = FixBuilder("", SAFE, frozenset(requires))
        for line, statement in [*getattr(self, "sibling_rebindings", ()), *getattr(self, "inference_rebindings", ())]:
            self.builder.replace(line, statement)
        self.init = init
        self.init_line = self._init_line(init)
        self.home = self._function_scope(init.call)
        if self.home.kind not in ("function", "module"):
            raise Unfixable("`amp.initialize` is called in a class body")
        if self.usage.carrier is not None:
            check_stores(self)  # _amp_carrier.py: the module stored on an object for later

    def _fix_without_steps(self, plan: AmpPlan) -> Optional[Fix]:
        """No loss is scaled in this file: the handle goes, or the training step is in another
        file; under O0 alone the plan goes on (the fp32 rewrite needs no step)."""
        init, fp32 = self.init, self.fp32
        if not fp32 and init.api == "init":
            return self._inference_drop(init)  # the handle is not used: nothing but the call to remove
        if self._threads_scaler_out():
            return self._split_fix(plan)  # the training step is in another file (_cross_threading.py)
        if not fp32 and any(r.api == "train_pass" for r in self.refs):
            return None  # apex's module goes to a training function of another file (_passed_training.py)
        if not fp32:
            timm = timm_scaler_fix(self)  # timm's ApexScaler runs the step (_timm_scaler.py)
            if timm is not None:
                return timm
            raise Unfixable(NO_STEP_REASON)
        return None

    def _without_init_beside_initialize(self, inits: List[AmpRef]) -> List[AmpRef]:
        """`amp.init()` as a statement of its own, its handle unused, in the function that calls
        `amp.initialize` (a re-id trainer's "Register function" line after it): apex's
        `amp.initialize` at O1 ran that same `init` itself (patching torch's functions, which
        autocast now does), and the handle of the old API is not used: the line goes with the
        migration of the `amp.initialize` beside it."""
        setups = [r for r in inits if r.api == "initialize" and r.call is not None]
        if len(setups) != 1:
            return inits
        home = self._function_scope(setups[0].call)
        kept = []
        for ref in inits:
            line = self._init_line(ref) if ref.api == "init" and ref.call is not None else None
            if (
                line is None or len(line.body) != 1 or not isinstance(line.body[0], cst.Expr)
                or line.body[0].value is not ref.call or self._function_scope(ref.call) is not home
                or any(arg.keyword is None or arg.keyword.value not in ("enable_caching", "verbose") for arg in ref.call.args)
            ):
                kept.append(ref)
                continue
            self.removal.remove_statement(line)
            self.handled.add(line)
            self._note(
                f"`amp.init()` at line {self._line(ref.call)} goes: `amp.initialize` set up the same function "
                "patches (autocast's work now), and its handle was not used"
            )
            if "O0" in scaler_spec(self.module, self.names, setups[0].call, self.ctx.quote).levels:
                self.unsafe.append(
                    f"under O0, `amp.init()` at line {self._line(ref.call)} still patched torch's functions to "
                    "run in float16; the migration runs O0 in float32"
                )
        self.refs = [r for r in self.refs if r in kept or r.api != "init"]
        return kept

    def _without_inference_inits(self, inits: List[AmpRef]) -> List[AmpRef]:
        """A file that trains (`amp.initialize(model, optimizer)`) and also initializes a model
        without optimizers, or with one nothing reads again (an evaluation entry point, an EMA
        copy; _unused_optimizer.py): the training call is the one
        migrated; each inference call goes, its model then running in fp32 (the note says so)."""
        training, inference = [], []
        for ref in inits:
            if ref.api != "initialize" or ref.call is None:
                return inits
            spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote)
            if spec.error:
                return inits
            alone = spec.optimizers is None or (len(inits) > 1 and optimizer_never_read(self, ref))
            (inference if alone and spec.levels != {"O0"} else training).append(ref)
        if not training or not inference:
            return inits
        for ref in inference:
            self._drop_inference_init(ref)
        self.refs = [r for r in self.refs if r not in inference]
        return training

    def _drop_inference_init(self, ref: AmpRef) -> None:
        """Remove `model = amp.initialize(model, ...)` (no optimizers): torch.amp has no model-level
        conversion, so the model runs in fp32 unless its calls are under autocast."""
        line = self._init_line(ref)
        small = line.body[0]
        rebinding = None
        if ref.api == "init":
            pass  # `handle = amp.init(...)`: the handle has no use left (a use would have stopped the plan)
        elif isinstance(small, cst.Assign) and not _rebinds_its_arguments(small, ref.call, self.names):
            # `model, optimizer = amp.initialize(model.cuda(), optimizer)`: apex returned what it was
            # given, so the line keeps binding that (`model = model.cuda()`)
            try:
                spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote)
                rebinding = None if spec.error else self._rebinding_of(line, ref.call, spec)
            except Unfixable:
                rebinding = None
            if rebinding is None:
                raise Unfixable(
                    f"`amp.initialize` without optimizers at line {self._line(ref.call)} binds other names than the "
                    "model it is given"
                )
        if not isinstance(small, (cst.Assign, cst.Expr)):
            raise Unfixable(f"`amp.initialize` at line {self._line(ref.call)} is not a statement of its own")
        half = self._half_cast()
        if half is not None:
            raise Unfixable(
                f"`amp.{ref.api}` at line {self._line(ref.call)} ran the model in fp16, and line "
                f"{self._line(half)} casts to half: with the call gone, the fp32 model would get fp16 inputs"
            )
        if rebinding is not None:
            statement = self.ctx.parse_statement(rebinding + "\n").with_changes(leading_lines=line.leading_lines)
            if getattr(self, "builder", None) is None:  # replaced once the fix is being built (`_build`)
                self.inference_rebindings = [*getattr(self, "inference_rebindings", ()), (line, statement)]
            else:
                self.builder.replace(line, statement)
        else:
            self.removal.remove_statement(line)
        self.handled.add(line)
        spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote) if ref.api == "initialize" else None
        what, runs = (
            ("`amp.init()`", "the models now run")
            if spec is None
            else ("`amp.initialize` without optimizers", "that model now runs")
            if spec.optimizers is None
            else ("`amp.initialize` with an optimizer nothing uses again", "that model now runs")
        )
        self._note(
            f"{what} at line {self._line(ref.call)} goes: {runs} in fp32; "
            'wrap their calls in `torch.autocast("cuda", dtype=torch.float16)` for apex\'s fp16 speed'
        )

    def _half_cast(self) -> Optional[cst.CSTNode]:
        """A `.half()` call or a float16 dtype in the file, which an fp16 model may rely on."""
        return next(self._half_casts(), None)  # _multi_init.py

    def _without_reinitializations(self, inits: List[AmpRef]) -> List[AmpRef]:
        """`amp.initialize` again on the same model and optimizer with the same options (a resume
        path that re-initializes before `amp.load_state_dict`, as apex's docs ask): with torch.amp
        there is nothing to redo, so the repeats go and the first call is the one migrated."""
        first = inits[0]
        self.sibling_rebindings: List[Tuple[cst.CSTNode, cst.BaseStatement]] = []
        if first.call is None or any(r.api != "initialize" or r.call is None for r in inits):
            raise Unfixable("`amp.initialize` is called more than once in this file")
        keys = _initialize_keys(first.call, self._init_line(first).body[0])
        repeats = inits[1:]
        siblings = []
        alternatives = [r for r in repeats if self._alternative_initialize(first, r)]
        if alternatives and (len(alternatives) < len(repeats) or not self.alternatives_apart(first, alternatives)):
            raise Unfixable(
                f"{MORE_THAN_ONCE} (line {self._line(alternatives[0].call)} in another arm of an `if`, and more): "
                "only alternatives each in an arm of one `if`/`elif`/`else` are one setup the fix follows"
            )
        for ref in repeats:
            if ref not in alternatives and keys and _initialize_key(ref.call) in keys:
                self._check_not_an_other_arm(first, ref)  # _multi_init.py: no re-initialization after it
            if ref in alternatives:
                pass  # the other arm of the `if`: one setup at run time (_multi_init.py)
            elif not keys or _initialize_key(ref.call) not in keys or not self._same_objects(first, ref):
                if not self._sibling_initialize(first, ref):
                    raise Unfixable(
                        f"`amp.initialize` is called more than once in this file (line {self._line(ref.call)} with "
                        "other models, optimizers or options): one GradScaler per call is not built yet"
                    )
                siblings.append(ref)
            line = self._init_line(ref)
            if ref not in alternatives and ref not in siblings:
                self._check_not_repeated_in_a_loop(first, ref)
            small = line.body[0]
            rebinding = None
            if isinstance(small, cst.Assign) and not _rebinds_its_arguments(small, ref.call, self.names):
                if ref not in siblings and ref not in alternatives:
                    raise Unfixable(
                        f"`amp.initialize` at line {self._line(ref.call)} binds other names than the model and optimizer it is given"
                    )
                # `modelD, optimizers_D = amp.initialize(modelD, [modelD.optimizer_D] + optimizer_D_T)`:
                # apex returned what it was given, which those names still have to hold.
                rebinding = self._rebinding_of(line, ref.call, scaler_spec(self.module, self.names, ref.call, self.ctx.quote))
            if ref in alternatives and self._defers_alternative(first, ref, line, rebinding):
                continue  # _multi_init.py: its line is replaced as the home's is, in `_place_home`
            if rebinding is not None:  # replaced once the fix is being built (`_build`)
                statement = self.ctx.parse_statement(rebinding + "\n").with_changes(leading_lines=line.leading_lines)
                self.sibling_rebindings.append((line, statement))
            else:
                self.removal.remove_statement(line)
            self.handled.add(line)
        again = [r for r in repeats if r not in siblings and r not in alternatives]
        if alternatives:
            self._plan_alternatives(first, alternatives)
        if again:
            self._note(
                "`amp.initialize` of the same model and optimizer again at line "
                + ", ".join(str(self._line(r.call)) for r in again)
                + " goes (torch.amp has nothing to re-initialize)"
            )
        self.sibling_models = [bound_arguments(r.call, INITIALIZE_PARAMS)["models"].value for r in siblings]
        if siblings:
            self._note(
                "one GradScaler serves the models and optimizers of `amp.initialize` at line "
                + ", ".join(str(self._line(r.call)) for r in siblings)
                + " too, as apex's calls shared the loss scaler the last one made"
            )
        self.refs = [r for r in self.refs if r not in repeats]
        return [first]

    def _check_not_repeated_in_a_loop(self, first: AmpRef, repeat: AmpRef) -> None:
        """A repeat in a loop the first call is not in runs again and again: apex made new loss
        scalers at each call (a scale starting afresh), which one GradScaler made by the first
        call would not do."""
        outer = {id(a) for a in self.names.ancestors(self._init_line(first))}
        for node in self.names.ancestors(self._init_line(repeat)):
            if isinstance(node, (cst.For, cst.While)) and id(node) not in outer:
                raise Unfixable(
                    f"`amp.initialize` at line {self._line(repeat.call)} runs again on each pass of the loop at line "
                    f"{self._line(node)}, where apex made its loss scalers anew; one GradScaler made at line "
                    f"{self._line(first.call)} would carry its scale over"
                )
            if isinstance(node, cst.FunctionDef):
                return

    def _sibling_initialize(self, first: AmpRef, other: AmpRef) -> bool:
        """`gen, gen_opt = amp.initialize(gen, gen_opt, opt_level="O1")` then the same for the
        discriminator, in the same block with the same options: each call replaced apex's loss
        scalers, so every `scale_loss` used the one the last call made; one GradScaler is that."""
        first_key, other_key = _initialize_key(first.call), _initialize_key(other.call)
        if first_key is None or other_key is None:
            return False
        if _options(first_key) != _options(other_key) or "optimizers" not in dict(other_key):
            return False
        first_line, other_line = self._init_line(first), self._init_line(other)
        return self.names.parent(first_line) is self.names.parent(other_line)

    def _finish(self, message: str) -> Fix:
        """The fix, its message carrying the notes, unsafe when something changes numerics."""
        from ampmigrate.rules.apex._checkpoint_threading import check_passed

        check_passed(self)  # no call of a checkpoint helper of another file left without its scaler
        enclosure = getattr(getattr(self, "access", None), "enclosure", None)
        if enclosure is not None:
            enclosure.check_uses()  # _init_enclosure.py: `amp.initialize` in a loop or a `try`
        self._check_alternative_placed()  # _multi_init.py
        for line, statement in getattr(self, "inference_rebindings", ()):
            if not self.builder.replaces(line):  # a path that made its own builder (`_drop_inference_init`)
                self.builder.replace(line, statement)
        if not getattr(self, "fp32", False):
            self._check_casts_left_behind()
        details = self.notes + ([f"unsafe: {'; '.join(self.unsafe)}"] if self.unsafe else [])
        if details:
            message += " (" + "; ".join(details) + ")"
        self.builder.message = message
        self.builder.applicability = UNSAFE if self.unsafe else SAFE
        return self.builder.build()

    def _check_casts_left_behind(self) -> None:
        """`amp.register_float_function(torch, "sigmoid")` (or a cast decorator) that AMP105 cannot
        rewrite: apex ran that op in float32 inside the fp16 regions, torch.autocast will not, so a
        migration that keeps the rest of apex's numerics is unsafe until it is cast by hand."""
        from ampmigrate.rules.apex.amp105_apex_amp_cast_annotations import cast_left_behind

        usage = getattr(self, "usage", None)
        for ref in usage.refs if usage is not None else ():
            if ref.api not in APEX_AMP_CAST_ANNOTATIONS:
                continue
            dtype = cast_left_behind(self.ctx, ref)
            if dtype is not None:
                code = self.ctx.code(ref.call if ref.call is not None else ref.node).strip()
                self.unsafe.append(
                    f"`{code}` at line {self._line(ref.node)} made apex run that code in {dtype}; torch.autocast "
                    "runs it as its own cast lists say, so its precision changes until it is cast by hand (AMP105)"
                )
        index = self.ctx.project_index
        for where, code, line in index.cast_registrations_elsewhere(self.ctx.path) if index is not None else ():
            self.unsafe.append(
                f"`{code}` ({where}:{line}) changed how apex ran that op in the whole program; torch.autocast has no "
                "such registration, so its precision changes until it is cast by hand (AMP105)"
            )

    # ------------------------------------------------------------------ inference (no optimizers)
    def _inference_fix(self, plan: AmpPlan, init: AmpRef, spec) -> Fix:
        """`model = amp.initialize(model, opt_level=...)` without optimizers runs the model in fp16
        for inference: each following statement of the same block that runs the model (calls it,
        or hands it to a call) goes under `torch.autocast("cuda", dtype=torch.float16)`, enabled
        as apex was; the initialize line goes."""
        why_not = (
            "`amp.initialize` without optimizers is inference, and no statement after it in the same block "
            'runs the model: wrap the inference in `torch.autocast("cuda", dtype=torch.float16)` by hand'
        )
        if any(r.api not in (None, "initialize") for r in self.refs if r is not init):
            raise Unfixable(why_not)
        self.fp32, self.spec, self.init = False, spec, init
        self.unsafe.extend(spec.unsafe)
        self.notes.extend(spec.notes)
        self.setup_guards = []
        if spec.o3_test is not None:
            # As in training (`_enter_setup`): O3 (the model cast to fp16, its inputs cast) now
            # stops where `amp.initialize` ran; O0 and O1/O2 keep their meaning.
            self.unsafe.remove(spec.o3_unsafe)
            message = self.ctx.string("apex opt_level O3 (pure fp16) has no torch.amp equivalent; use O1 or O2").value
            self.setup_guards = [f"if {spec.o3_test}:\n    raise ValueError({message})"]
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        self.init_line = self._init_line(init)
        if not self._inference_autocast(init, spec, why_not):
            return self._inference_drop(init)
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        return self._finish("Migrate inference under apex.amp to torch.autocast fp16")

    def _inference_autocast(
        self, init: AmpRef, spec, why_not: str, anchor: Optional[cst.CSTNode] = None, models: Optional[Set[str]] = None
    ) -> bool:
        """The statements after the inference `amp.initialize` (`self.init_line`) in its block
        that run the model go under `torch.autocast`, and the call goes; False (nothing planned)
        where the call is inside a block of its function or no such statement follows. `anchor`
        and `models`: the `if` whose arms hold several such calls, and their models together (the
        caller removes the calls)."""
        # The line itself, or `if <cond>: model = amp.initialize(...)` alone in its `if` (then the
        # condition joins `enabled` and the `if` goes), directly in the function's (module's) body.
        arms = anchor
        anchor, conditions = anchor or self.init_line, []
        parent_block = self.names.parent(anchor)
        guard = self.names.parent(parent_block)
        if arms is None and isinstance(guard, cst.If) and guard.orelse is None and len(body_of(parent_block) or ()) == 1:
            if not is_pure(guard.test):
                raise Unfixable(why_not)
            anchor, conditions = guard, [self.ctx.code(guard.test).strip()]
        block = self.names.parent(anchor)
        function = self._function_scope(init.call).node
        if self.names.parent(block) is not function and block is not self.module:
            guarded = getattr(self, "setup_guards", None) and [u for u in spec.unsafe if u != spec.o3_unsafe]
            nested = self._nested_inference_anchor(anchor, function) if not (guarded if guarded is not None else spec.unsafe) else None
            if nested is None:
                # inside a loop, a `with`, a `try` of its function; or options that make autocast
                # unsafe (a run-time opt level), where dropping the call is the safe rewrite
                return False
            outer, conditions = nested
            block = self.names.parent(outer)
            body = list(body_of(block) or ())
            after = body[body.index(outer) + 1 :]
        else:
            body = list(body_of(block) or ())
            after = body[body.index(anchor) + 1 :]
            outer = anchor
        models = models or self._initialized_names()
        runs = self._statements_running(after, models)
        if not runs:
            return False
        if outer is not anchor and not self._conditions_hold(outer, runs, conditions):
            return False
        if not all(c.code and is_pure(cst.parse_expression(c.code)) for c in spec.enabled):
            raise Unfixable(why_not)
        codes = _distinct_tests([*conditions, *(c.code for c in spec.enabled if c.code != "True")])
        if outer is not anchor:
            from ampmigrate.rules.apex._scaler_access import _as_bools

            codes = _as_bools(codes, self.ctx.shared("apex.bool_names", lambda: bool_names(self.ctx.text)))
        enabled = " and ".join(f"({c})" if len(codes) > 1 and not _atomic(c) else c for c in codes)
        torch = self._torch(self.init_line)
        args = f'{self.ctx.string("cuda").value}, dtype={torch}.float16' + (f", enabled={enabled}" if enabled else "")
        for statement in runs:
            if self.builder.replaces(statement):
                # another inference setup of the file runs it too, under its own conditions
                raise Unfixable(
                    f"line {self._line(statement)} runs models that `amp.initialize` at line {self._line(init.call)} "
                    "and another inference setup of this file set up under other conditions or options: wrap the "
                    'inference in `torch.autocast("cuda", dtype=torch.float16)` by hand'
                )
            fp32_lines = self._escape_banned_calls(Region(block, [statement]))
            header = self.ctx.parse_statement(f"with {torch}.autocast({args}):\n    pass\n")
            inner = indent_continuations(
                with_lines_replaced(statement, fp32_lines).with_changes(leading_lines=()), self.module.default_indent
            )
            wrapped = header.with_changes(body=header.body.with_changes(body=[inner]), leading_lines=statement.leading_lines)
            self.builder.replace(statement, wrapped)
        if arms is not None:
            pass
        elif anchor is self.init_line:
            self._place_home(None)
        elif self._rebinding() is None and getattr(self, "setup_guards", None):
            # `if cond: model = amp.initialize(...)`: the O3 guard runs under the same test
            test = f"({conditions[0]}) and {spec.o3_test}" if len(conditions) == 1 else None
            if test is None:
                raise Unfixable(why_not)
            guard = self.setup_guards[0].replace(f"if {spec.o3_test}:", f"if {test}:", 1)
            self.builder.replace(anchor, self.ctx.parse_statement(guard + "\n").with_changes(leading_lines=anchor.leading_lines))
            self.handled.add(self.init_line)
        elif self._rebinding() is None:
            self.removal.remove_statement(anchor)
            self.handled.add(self.init_line)
        else:
            raise Unfixable(why_not + " (it binds other names than the model it is given)")
        return True

    def _nested_inference_anchor(self, line: cst.CSTNode, function: cst.CSTNode) -> Optional[Tuple[cst.If, List[str]]]:
        """(the `if` in the function's body that the inference `amp.initialize` lies in, through
        `if`/`elif`/`else` arms only, the tests that chose its arm as code), or None (a loop, a
        `with`, a `try` on the way, or a test with side effects). ZenNAS's val.py: `if opt.gpu is
        not None: ... if opt.apex: model = amp.initialize(model, opt_level="O1") elif opt.fp16:
        model = model.half()`, the evaluation loop after the outer `if`."""
        outer = None
        for ancestor in self.names.ancestors(line):
            if ancestor is function or _runs_in_order(self.names, ancestor, function):
                break
            if isinstance(ancestor, cst.If):
                outer = ancestor
            elif not isinstance(ancestor, (cst.IndentedBlock, cst.Else)):
                return None
        if outer is None:
            return None
        path = self._branches(line, self.names.parent(outer))
        if not path:
            return None
        code = condition_code(self.module, path)
        if code is None:
            return None
        return outer, [code]

    def _conditions_hold(self, outer: cst.If, runs: List[cst.CSTNode], conditions: List[str]) -> bool:
        """Nothing from the `if` that set apex up to the last statement running the model writes
        what its tests read: autocast there is enabled by those same tests."""
        reads: Set[str] = set()
        for code in conditions:
            reads |= reads_of(cst.parse_expression(code))
        block = self.names.parent(outer)
        body = list(body_of(block) or ())
        tops = []
        for run in runs:
            top = run
            while self.names.parent(top) is not block:
                top = self.names.parent(top)
            tops.append(body.index(top))
        span = body[body.index(outer) : max(tops) + 1]
        for statement in span:
            for written in stores_in(statement):
                if any(r == written or r.startswith(written + ".") or written.startswith(r + ".") for r in reads):
                    return False
        return True

    def _inference_drop(self, init: AmpRef) -> Fix:
        """No model run follows the inference `amp.initialize` in its block (the model is returned,
        stored or run elsewhere): the call goes, and the model runs in fp32 (the fix says so)."""
        self.unsafe, self.notes = [], []  # the opt level and loss scale no longer matter
        self.setup_guards = []
        self._drop_inference_init(init)
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        return self._finish("Remove apex.amp's inference setup")

    def _initialized_names(self) -> Set[str]:
        small = self.init_line.body[0]
        targets = [small.targets[0].target] if isinstance(small, cst.Assign) else []
        if targets and isinstance(targets[0], (cst.Tuple, cst.List)):
            targets = [e.value for e in targets[0].elements]
        models = [self.spec.models] if self.spec.models is not None else []
        if models and isinstance(models[0], (cst.Tuple, cst.List)):
            models = [e.value for e in models[0].elements]
        return {n.value for n in [*targets, *models] if isinstance(n, cst.Name)}

    def _statements_running(self, statements: Sequence[cst.CSTNode], models: Set[str]) -> List[cst.CSTNode]:
        """The simple statements that run a model, looking inside `with`/`for`/`if`/`try` blocks (so a
        loop is not re-indented whole); a compound statement on one line counts as one statement."""
        found: List[cst.CSTNode] = []
        for statement in statements:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or not self._runs_model(statement, models):
                continue
            blocks = [b for b in _blocks_of(statement) if isinstance(b, cst.IndentedBlock)]
            if isinstance(statement, cst.SimpleStatementLine) or len(blocks) != len(_blocks_of(statement)):
                found.append(statement)
                continue
            inner = [s for b in blocks for s in self._statements_running(b.body, models)]
            # A model run in the compound statement's header (`for x in model(...)`): the whole of it.
            found.extend(inner if inner else [statement])
        return found

    def _runs_model(self, statement: cst.CSTNode, models: Set[str]) -> bool:
        """Calls a model (`model(x)`, `model.generate(x)`) or hands it to a call (`evaluate(model, ...)`);
        not its bookkeeping (`model.eval()`, `model.to(device)`)."""
        for node in walk(statement):
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            if isinstance(func, cst.Name) and func.value in models:
                return True
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in models:
                if func.attr.value not in _MODEL_BOOKKEEPING:
                    return True
            if any(isinstance(a.value, cst.Name) and a.value.value in models for a in node.args):
                qnames = self.names.qualified_names(func)
                if isinstance(func, cst.Name) and func.value in _NOT_COMPUTE_BUILTINS and not self.names.bindings_of(func):
                    continue
                if any(q.startswith(("torch.nn.", "torch.jit.")) for q in qnames):
                    continue  # wrapping or scripting it (DataParallel, torch.jit.script) runs nothing
                return True
        return False

    def _standalone_fix(self, plan: AmpPlan) -> Fix:
        """No `amp.initialize` here, and nothing that needs the scaler: `amp.disable_casts()`,
        `amp.master_params(opt)` outside a backward/step window, tests of apex, the import."""
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        self.fp32 = True
        for ref in self.refs:
            if ref.api == "disable_casts":
                self._rewrite_disable_casts(ref)
            elif ref.api == "master_params":
                statement = self.names.statement_of(ref.node)
                if any(self._reads_gradients(n) for n in walk(statement)):
                    raise Unfixable(
                        f"`amp.master_params` at line {self._line(ref.node)} reads gradients, which are scaled "
                        "until `scaler.unscale_(optimizer)`, and the scaler is not in this file"
                    )
                self._rewrite_master_params(ref)
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        uses = [s.api for s in plan.sites if s.api != "import"]
        self.builder.message = (
            "Replace " + ", ".join(f"`amp.{api}`" for api in dict.fromkeys(uses)) + " with torch"
            if uses
            else "Remove the apex.amp import (apex.amp was removed in May 2025)"
        )
        return self.builder.build()

    # ------------------------------------------------------------------ shapes
    def _init_line(self, init: AmpRef) -> cst.SimpleStatementLine:
        call = init.call
        small = self.names.parent(call)
        if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
            pass
        elif isinstance(small, cst.Expr) and small.value is call:
            pass
        else:
            raise Unfixable("the result of `amp.initialize` is used inside an expression")
        line = self.names.parent(small)
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            raise Unfixable("`amp.initialize` shares its line with other statements")
        return line

    def _function_scope(self, node: cst.CSTNode) -> Scope:
        scope = self.names.scope_of(node)
        while scope.kind in ("comprehension", "lambda") and scope.parent is not None:
            scope = scope.parent
        return scope

    def _step(self, ref: AmpRef) -> Step:
        call = ref.call
        if call is None:
            raise Unfixable(f"`{self.ctx.code(ref.node)}` is used without being called")
        item = self.names.parent(call)
        with_node = self.names.parent(item)
        if not (isinstance(item, cst.WithItem) and isinstance(with_node, cst.With) and len(with_node.items) == 1):
            raise Unfixable(f"`amp.scale_loss` at line {self._line(call)} is not the only item of a `with` statement")
        if with_node.asynchronous is not None or item.asname is None or not isinstance(item.asname.name, cst.Name):
            raise Unfixable(f"`with amp.scale_loss(...)` at line {self._line(call)} does not bind the scaled loss to a name")
        scaled = item.asname.name.value
        backward_args = self._backward_args(with_node, scaled)
        rest = self._rest_of_body(with_node, scaled)
        branched: Sequence[cst.Call] = ()
        if backward_args is None:
            branched = self._branched_backwards(with_node, scaled, call)
            if branched:
                backward_args, rest = (), list(with_node.body.body)
        bound_body = self._bound_body(with_node, scaled)
        if backward_args is not None and rest is not None:
            try:
                self._drop_scaled_dels(with_node, scaled)
                bound_body = None  # the scaled loss needs no name of its own
            except Unfixable:
                if bound_body is None:
                    raise
        if bound_body is not None:
            backward_args, rest, branched = (), bound_body, ()
        if backward_args is None:
            raise Unfixable(
                f"the body of `with amp.scale_loss(...)` at line {self._line(call)} does not start with "
                f"`{scaled}.backward()` alone on its line, nor uses `{scaled}` only in `{scaled}.backward(...)` "
                "statements of its branches"
            )
        if rest is None:
            raise Unfixable(
                f"after `{scaled}.backward()`, the body of `with amp.scale_loss(...)` at line {self._line(call)} "
                f"uses `{scaled}` or apex, or leaves the block early"
            )
        params = SCALE_LOSS_PARAMS if not ref.via_handle else ("loss", "optimizers")
        bound = bound_arguments(call, params)
        if bound is None or "loss" not in bound or "optimizers" not in bound:
            raise Unfixable(f"`amp.scale_loss` at line {self._line(call)} has arguments apex's signature does not match")
        optimizers_node = bound["optimizers"].value
        if isinstance(optimizers_node, (cst.List, cst.Tuple)):
            optimizers = [e.value for e in optimizers_node.elements]
        else:
            optimizers = [optimizers_node]
        for optimizer in optimizers:
            if not plain_optimizer(optimizer):
                raise Unfixable(f"the optimizer passed to `amp.scale_loss` at line {self._line(call)} is not a plain name")
        if "delay_unscale" in bound:
            self._note("`delay_unscale` goes: GradScaler keeps gradients scaled until `unscale_`/`step`")
        function = self._function_scope(call)
        step = Step(
            with_node,
            call,
            bound["loss"].value,
            optimizers,
            backward_args,
            function,
            self._branches(with_node, function.node),
        )
        step.rest = rest
        step.backward_calls = branched
        step.binds_scaled = scaled if bound_body is not None else None
        return step

    def _bound_body(self, with_node: cst.With, scaled: str) -> Optional[Sequence[cst.BaseStatement]]:
        """The whole body, when it can follow `<scaled> = scaler.scale(loss)` unchanged: it never
        leaves the block early (apex unscales at the block's exit, which a `return` would still run,
        but GradScaler's unscale waits for the step), never rebinds the scaled loss, and names apex
        only in `amp.master_params(...)` (rewritten with the others). In apex the body runs on the
        scaled loss and still-scaled gradients; so it does after the binding. None otherwise."""
        body = with_node.body
        statements = list(body.body) if isinstance(body, cst.IndentedBlock) else [cst.SimpleStatementLine(body=body.body)]
        for node in walk(body):
            if isinstance(node, (cst.Return, cst.Break, cst.Continue, cst.Raise, cst.Yield, cst.Await)):
                return None
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Global, cst.Nonlocal)):
                return None
            if isinstance(node, cst.Name) and node.value == scaled and node not in self.names.loads:
                return None  # stored or deleted in the body
        inside = {id(n) for n in walk(body)}
        if any(id(ref.node) in inside and not (ref.api == "master_params" and ref.call is not None) for ref in self.refs):
            return None
        return statements

    def _drop_scaled_dels(self, with_node: cst.With, scaled: str) -> None:
        """The scaled loss is no longer bound once the `with` goes: `del scaled_loss` after it
        (RetinaNet's `train_batch`) goes too, where every binding of the name in the function is a
        `with amp.scale_loss(...) as <name>`; any other read of it outside the block refuses."""
        function = self._function_scope(with_node)
        inside = {id(n) for n in walk(with_node)}
        reads = [
            n for n in walk(function.node)
            if isinstance(n, cst.Name) and n.value == scaled and id(n) not in inside
            and (n in self.names.loads or isinstance(self.names.parent(n), cst.Del))
        ]
        if not reads:
            return
        withs = {id(r.call) for r in self.refs if r.api == "scale_loss" and r.call is not None}
        for binding in self.names.lookup(scaled, function):
            statement = binding.statement
            items = statement.items if isinstance(statement, cst.With) else ()
            if not any(id(i.item) in withs and i.asname is not None and i.asname.name is binding.node for i in items):
                raise Unfixable(
                    f"`{scaled}` is bound otherwise than by `with amp.scale_loss(...)` in the function of line "
                    f"{self._line(with_node)}, and read outside that block"
                )
        for name in reads:
            target = self.names.parent(name)
            line = self.names.parent(target) if isinstance(target, cst.Del) else None
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and target.target is name:
                self.removal.remove_statement(line)
                self.handled.add(line)
                continue
            if any(isinstance(a, cst.With) and id(a) != id(with_node) and any(id(i.item) in withs for i in a.items)
                   for a in self.names.ancestors(name)):
                continue  # inside another scaled block: its own step judges it
            raise Unfixable(
                f"`{scaled}`, the scaled loss of the `with` at line {self._line(with_node)}, is read at line "
                f"{self._line(name)}, outside the block: the migration no longer binds it"
            )

    def _branched_backwards(self, with_node: cst.With, scaled: str, call: cst.Call) -> Sequence[cst.Call]:
        """The `scaled.backward(...)` statements of a body that does not start with one, when the
        scaled loss is used for nothing else, the body never leaves early, and apex appears in it
        only as `amp.master_params` (see `_rest_of_body`): the calls, else ()."""
        body = with_node.body
        if not isinstance(body, cst.IndentedBlock):
            return ()
        bound = bound_arguments(call, SCALE_LOSS_PARAMS) or {}
        loss = bound.get("loss")
        if loss is None or not isinstance(loss.value, (cst.Name, cst.Attribute)) or not is_pure(loss.value):
            return ()  # `scaler.scale(loss)` is spelled at each call
        calls: List[cst.Call] = []
        for node in walk(body):
            if isinstance(node, (cst.Return, cst.Break, cst.Continue, cst.Raise, cst.Yield, cst.Await)):
                return ()
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Global, cst.Nonlocal)):
                return ()
            if not (isinstance(node, cst.Name) and node.value == scaled):
                continue
            attribute = self.names.parent(node)
            backward = self.names.parent(attribute)
            expr = self.names.parent(backward)
            if not (
                isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "backward"
                and isinstance(backward, cst.Call) and backward.func is attribute
                and isinstance(expr, cst.Expr) and expr.value is backward
                and not any(isinstance(n, cst.Name) and n.value == scaled for a in backward.args for n in walk(a))
            ):
                return ()
            calls.append(backward)
        inside = {id(n) for n in walk(body)}
        if any(id(ref.node) in inside and not (ref.api == "master_params" and ref.call is not None) for ref in self.refs):
            return ()
        return calls

    def _backward_args(self, with_node: cst.With, scaled: str) -> Optional[Sequence[cst.Arg]]:
        body = with_node.body
        smalls: List[cst.BaseSmallStatement]
        if isinstance(body, cst.SimpleStatementSuite):
            smalls = list(body.body)
        else:
            if not body.body or not isinstance(body.body[0], cst.SimpleStatementLine):
                return None
            smalls = list(body.body[0].body)
        if len(smalls) != 1 or not isinstance(smalls[0], cst.Expr):
            return None
        call = smalls[0].value
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "backward"
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value == scaled
            and not any(isinstance(n, cst.Name) and n.value == scaled for a in call.args for n in walk(a))
        ):
            return call.args
        return None

    def _rest_of_body(self, with_node: cst.With, scaled: str) -> Optional[Sequence[cst.BaseStatement]]:
        """The statements after `scaled.backward()` in the body, when they can run after
        `scaler.scale(loss).backward()` as they are: in apex they see the gradients still scaled
        (the unscale happens at the block's exit), as they do before `scaler.unscale_`. None when
        one uses the scaled loss or apex, or leaves the block early (a return, break, raise, yield)."""
        body = with_node.body
        if isinstance(body, cst.SimpleStatementSuite):
            return ()
        rest = list(body.body[1:])
        for statement in rest:
            for node in walk(statement):
                if isinstance(node, cst.Name) and node.value == scaled:
                    return None
                if isinstance(node, (cst.Return, cst.Break, cst.Continue, cst.Raise, cst.Yield, cst.Await)):
                    return None
                if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Global, cst.Nonlocal)):
                    return None
        inside = {id(n) for statement in rest for n in walk(statement)}
        if any(id(ref.node) in inside and not (ref.api == "master_params" and ref.call is not None) for ref in self.refs):
            return None  # `amp.master_params(opt)` may stay: it reads the (still scaled) gradients, as in apex
        return rest

    def _check_other_refs(self) -> None:
        self._drop_self_stores()
        presence = self.presence_refs
        for ref in self.refs:
            if ref.api is None:
                try:
                    presence_action(self.names, ref.node, presence)
                except Unsupported:
                    raise Unfixable(
                        f"apex.amp is used as a value at line {self._line(ref.node)} (passed or stored), "
                        "where the fix cannot follow it"
                    )
            if ref.api == "unknown":
                raise Unfixable(
                    f"`{self.ctx.code(ref.node)}` (line {self._line(ref.node)}) is apex.amp internals with no "
                    "torch.amp counterpart"
                )
            if ref.via_handle and ref.api not in ("handle.scale_loss",):
                if ref.api == "handle":
                    raise Unfixable(f"the amp handle is used as a value at line {self._line(ref.node)}")
                raise Unfixable(f"`{self.ctx.code(ref.node)}` of the old handle API has no automatic rewrite")

    def _drop_self_stores(self) -> None:
        """`self.amp = amp` in a method, every other use of `self.amp` in the file an apex call the
        name pass resolves through it (`self.amp.initialize(...)`, `self.amp.scale_loss(...)`: MINet,
        RetinaNet trainers) or a store of None: the attribute only names apex for those calls,
        which the migration rewrites, so the store goes with the import. Not where another file of
        the run stores or reads that attribute (engine/apex_attrs.py)."""
        calls = {id(r.node) for r in self.refs if r.api is not None}
        dropped = []
        for ref in self.refs:
            if ref.api is not None:
                continue
            assign = self.names.parent(ref.node)
            if not (isinstance(assign, cst.Assign) and assign.value is ref.node and len(assign.targets) == 1):
                continue
            target = assign.targets[0].target
            line = self.names.parent(assign)
            if not (
                isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                and self.names.method_class_scope(target.value) is not None
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            ):
                continue
            if self._attribute_only_calls_apex(target, calls):
                dropped.append((ref, line))
        for ref, line in dropped:
            self.removal.remove_statement(line)
            self.handled.add(line)
        if dropped:
            gone = {id(ref) for ref, _ in dropped}
            self.refs = [r for r in self.refs if id(r) not in gone]

    def _attribute_only_calls_apex(self, target: cst.Attribute, calls: Set[int]) -> bool:
        attr = target.attr.value
        for node in self.names.nodes_of_type(cst.Attribute):
            if node.attr.value != attr or node is target:
                continue
            parent = self.names.parent(node)
            if node in self.names.store_attributes:
                if not self._stores_none(node):
                    return False
                continue
            if not (isinstance(parent, cst.Attribute) and parent.value is node and id(parent) in calls):
                return False
        index = self.ctx.project_index
        if index is not None:
            here = os.path.abspath(self.ctx.path)
            if any(other != here for other in index.apex_attr_files(attr)):
                return False
        return True

    def _stores_none(self, node: cst.Attribute) -> bool:
        """`self.amp = None`, or `self.model, self.amp = [None, None]`: the store gives it None."""
        parent = self.names.parent(node)
        if isinstance(parent, cst.AssignTarget):
            assign = self.names.parent(parent)
            return isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Name) and assign.value.value == "None"
        element, sequence = parent, self.names.parent(parent)
        if not (isinstance(element, cst.Element) and isinstance(sequence, (cst.Tuple, cst.List))):
            return False
        target, assign = self.names.parent(sequence), self.names.parent(self.names.parent(sequence))
        if not (isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign)):
            return False
        values = assign.value
        if not isinstance(values, (cst.Tuple, cst.List)) or len(values.elements) != len(sequence.elements):
            return False
        value = values.elements[list(sequence.elements).index(element)].value
        return isinstance(value, cst.Name) and value.value == "None"

    # ------------------------------------------------------------------ fp16 (O1/O2, amp.init)
    def _plan_fp16(self, steps: List[Step]) -> None:
        self.fp16_steps = steps
        scaler_scopes = [s.function for s in steps]
        for ref in self.refs:
            if ref.api in ("state_dict", "load_state_dict", "state_arg", "state_pass", "train_pass", "save_entry") or (
                ref.api == "_amp_state"
            ):
                scaler_scopes.append(self._function_scope(ref.node))
        from ampmigrate.rules.apex._checkpoint_threading import (
            helper_calls,
            pass_scaler,
        )

        helpers = helper_calls(self)  # checkpoint helpers of other files taking the scaler
        gradients = getattr(self, "gradient_calls", [])  # input gradients' helpers (_input_gradient_threading.py)
        scaler_scopes.extend(self._function_scope(call) for call, _, _ in [*helpers, *gradients])
        self.access = self._scaler_access(scaler_scopes)
        self.scaler_scopes = scaler_scopes
        pass_scaler(self, helpers)
        pass_scaler(self, gradients, "which scales the loss of its input gradient with it")
        regions: List[Tuple[Region, Step]] = []
        for step in steps:
            self._plan_step_calls(step, steps)
            try:
                found = autocast_regions(
                    self.names,
                    step.with_node,
                    step.loss,
                    self._model_test(step.function),
                    self._forward_like_test(step.function),
                    self._is_barrier,
                )
            except NoRegion as exc:
                found = self._single_caller_regions(step)  # _caller_forward.py
                if found is None:
                    found = [] if self._loss_from_wrapper_caller(step) else self._caller_regions(step)
                if found is None:
                    raise Unfixable(f"no autocast region for `amp.scale_loss` at line {self._line(step.call)}: {exc}")
            if found and getattr(self.access, "detached_init", None) is not None:
                raise Unfixable(
                    f"the scaler lives on `{self.access.cls.node.name.value}`, apart from `amp.initialize`; the "
                    "autocast region here would need apex's condition"
                )
            self._check_detached(step)
            regions.extend((r, step) for r in found)
            self.builder.replace(step.with_node, self._scaled_backward(step))
            self.handled.add(step.with_node)
        regions.extend(self._stepping_method_forwards(steps, [r for r, _ in regions]))  # _caller_forward.py
        plain = self._plain_backwards(steps)
        regions.extend(self._plain_backward_regions(plain))
        self._emit_steps(steps)
        self._plan_regions(regions)
        self._plan_unscale(steps)
        self._rewrite_plain_backwards(plain, self._unscale_points)
        self._plan_simple_refs()
        self._plan_presence_tests()
        self._plan_scaler_creation()
        # functions gaining a `scaler` parameter: no other file may call them (_threaded_importers.py)
        returning = [self.access.home] if getattr(self.access, "returned_to", None) is not None else []
        check_threaded_importers(
            self, [*getattr(self.access, "threaded", ()), *getattr(self.access, "helper_calls", {}), *returning]
        )
        self.access.emit()
        if self.usage.carrier is not None:
            emit_stores(self)

    def _scaler_access(self, scopes: List[Scope]) -> ScalerAccess:
        from ampmigrate.rules.apex._trainer_class import constructed_access

        return constructed_access(self, scopes) or ScalerAccess(self, scopes)  # a trainer class built at home

    def _threads_scaler_out(self) -> bool:
        """The scaler goes to a function of another file (the A side of _cross_threading.py)."""
        return False

    def _split_fix(self, plan: AmpPlan) -> Fix:  # pragma: no cover - only the A side plans one
        raise Unfixable(NO_STEP_REASON)

    def _scaled_backward(self, step: Step):
        scaler = self.access.expression(step.with_node)
        loss_code = self.ctx.code(step.loss).strip()
        if step.binds_scaled is not None:
            return self._bind_scaled(step, f"{scaler}.scale({loss_code})")
        if step.backward_calls:
            return self._unwrap_branched(step, f"{scaler}.scale({loss_code})")
        args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in step.backward_args)
        line = self.ctx.parse_statement(f"{scaler}.scale({loss_code}).backward({args})\n")
        return _then(line.with_changes(leading_lines=step.with_node.leading_lines), step.rest)

    def _bind_scaled(self, step: Step, value: str):
        """`<scaled> = <value>` in place of the `with` line, its body one level out after it."""
        line = self.ctx.parse_statement(f"{step.binds_scaled} = {value}\n")
        line = line.with_changes(leading_lines=step.with_node.leading_lines)

        def replacement(updated: cst.CSTNode) -> cst.CSTNode:
            body = updated.body
            statements = list(body.body) if isinstance(body, cst.IndentedBlock) else [cst.SimpleStatementLine(body=body.body)]
            return cst.FlattenSentinel([line, *statements])

        return replacement

    def _unwrap_branched(self, step: Step, scaled: str):
        """Each `scaled_loss.backward(...)` of the body becomes `<scaled>.backward(...)`, and the
        body, one level out, replaces the `with` (its comments before the `with` kept first)."""
        for call in step.backward_calls:
            args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in call.args)
            self.builder.replace(call, self.ctx.parse_expression(f"{scaled}.backward({args})"))
        leading = step.with_node.leading_lines

        def replacement(updated: cst.CSTNode) -> cst.CSTNode:
            first, *others = updated.body.body
            return cst.FlattenSentinel([first.with_changes(leading_lines=[*leading, *first.leading_lines]), *others])

        return replacement

    # ---- master_params, state_dict, load_state_dict, disable_casts, _amp_state
    def _plan_simple_refs(self) -> None:
        for ref in self.refs:
            if ref.api == "master_params":
                self._rewrite_master_params(ref)
            elif ref.api in ("state_dict", "load_state_dict"):
                if ref.call is None:
                    raise Unfixable(f"`amp.{ref.api}` is used without being called")
                scaler = self.access.expression(ref.call)
                if ref.api == "load_state_dict":
                    self._guarded_load(ref, scaler)
                    continue
                new_func = self.ctx.parse_expression(f"{scaler}.{ref.api}")
                self.builder.replace(ref.node, new_func)
                self.handled.add(ref.node)
            elif ref.api == "state_arg":
                plan_state_loader_arg(self, ref)
            elif ref.api == "state_pass":
                plan_state_param_arg(self, ref)
            elif ref.api == "save_entry":
                plan_checkpoint_entry(self, ref)
            elif ref.api == "train_pass":
                plan_train_param_arg(self, ref)
            elif ref.api == "disable_casts":
                self._rewrite_disable_casts(ref)
            elif ref.api == "_amp_state":
                if not self._initial_loss_scale(ref):
                    self._rewrite_loss_scale_read(ref)

    def _guarded_load(self, ref: AmpRef, scaler: str, when: str = "") -> None:
        """`amp.load_state_dict(state)` -> the scaler's, guarded (_state_load_guard.py)."""
        guard_state_load(self.ctx, self.builder, ref.call, scaler, "amp.load_state_dict", when)
        self.handled.add(ref.node)
        self._note(GUARD_NOTE)

    def _rewrite_master_params(self, ref: AmpRef) -> None:
        call = ref.call
        if call is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            raise Unfixable(f"`amp.master_params` at line {self._line(ref.node)} is not called with one optimizer")
        self.builder.replace(call, self._master_params_expression(ref))
        self.handled.add(call)

    def _master_params_expression(self, ref: AmpRef) -> cst.BaseExpression:
        """`amp.master_params(opt)` -> the optimizer's own parameters."""
        optimizer = ref.call.args[0].value
        code = self.ctx.code(optimizer).strip()
        if not isinstance(optimizer, (cst.Name, cst.Attribute)):
            code = f"({code})"
        params = self.ctx.string("params").value
        return self.ctx.parse_expression(f"[p for group in {code}.param_groups for p in group[{params}]]")

    def _rewrite_disable_casts(self, ref: AmpRef) -> None:
        call = ref.call
        item = self.names.parent(call) if call is not None else None
        if call is None or call.args or not isinstance(item, cst.WithItem):
            raise Unfixable(f"`amp.disable_casts` at line {self._line(ref.node)} is not used as `with amp.disable_casts():`")
        torch = self._torch(call)
        cuda = self.ctx.string("cuda").value
        self.builder.replace(call, self.ctx.parse_expression(f"{torch}.autocast({cuda}, enabled=False)"))
        self.handled.add(call)

    def _initial_loss_scale(self, ref: AmpRef) -> bool:
        """`amp._amp_state.loss_scalers[0]._loss_scale = 2**16` right after `amp.initialize`, before
        any training in that block: the scale apex starts from, GradScaler's `init_scale`. True
        when `ref` is such a write (then handled)."""
        chain, current = [], ref.node
        for _ in range(3):
            current = self.names.parent(current)
            chain.append(current)
        scalers, subscript, attribute = chain
        assign = self.names.parent(self.names.parent(attribute))  # Assign <- AssignTarget <- the attribute
        if not (
            isinstance(scalers, cst.Attribute)
            and scalers.attr.value == "loss_scalers"
            and isinstance(subscript, cst.Subscript)
            and isinstance(attribute, cst.Attribute)
            and attribute.attr.value == "_loss_scale"
            and isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and assign.targets[0].target is attribute
        ):
            return False
        index = subscript.slice[0].slice if len(subscript.slice) == 1 else None
        if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0"):
            raise Unfixable(f"`amp._amp_state` at line {self._line(ref.node)} sets another loss scaler than the first")
        line = self.names.parent(assign)
        block = self.names.parent(line)
        body = list(body_of(block) or ())
        if block is not self.names.parent(self.init_line) or line not in body or len(line.body) != 1:
            raise Unfixable(
                f"`amp._amp_state` at line {self._line(ref.node)} sets the loss scale away from `amp.initialize`: "
                "GradScaler takes a scale as `init_scale` or, after a step, as `scaler.update(new_scale)`; set it by hand"
            )
        between = body[body.index(self.init_line) + 1 : body.index(line)] if self.init_line in body else None
        if between is None or body.index(line) < body.index(self.init_line):
            raise Unfixable(f"`amp._amp_state` at line {self._line(ref.node)} sets the loss scale before `amp.initialize`")
        trains = {r.node for r in self.refs if r.api in ("scale_loss", "handle.scale_loss")}
        if any(node in trains for statement in between for node in walk(statement)):
            raise Unfixable(f"`amp._amp_state` at line {self._line(ref.node)} sets the loss scale after training began")
        if any(k == "init_scale" for k, _ in self.spec.keywords):
            raise Unfixable(f"`amp._amp_state` at line {self._line(ref.node)} overrides `loss_scale=` of `amp.initialize`")
        self.spec.keywords.append(("init_scale", self.ctx.code(assign.value).strip()))
        self.removal.remove_statement(line)
        self.handled.add(line)
        self._note("apex's initial loss scale (set through `amp._amp_state`) becomes `init_scale`")
        return True

    def _rewrite_loss_scale_read(self, ref: AmpRef) -> None:
        """`amp._amp_state.loss_scalers[0].loss_scale()` (or its attribute `._loss_scale`, read)
        -> `scaler.get_scale()` (a float, as apex's was; 1.0 where the scaler is disabled)."""
        node = ref.node
        chain = []
        current = node
        for _ in range(4):
            parent = self.names.parent(current)
            chain.append(parent)
            current = parent
        scalers, subscript, method, call = chain
        index = subscript.slice[0].slice if isinstance(subscript, cst.Subscript) and len(subscript.slice) == 1 else None
        first = isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0"
        if not (
            isinstance(scalers, cst.Attribute)
            and scalers.attr.value == "loss_scalers"
            and first
            and isinstance(method, cst.Attribute)
            and method.value is subscript
        ):
            raise Unfixable(f"`amp._amp_state` at line {self._line(node)} is apex internals the fix cannot map")
        if method.attr.value == "loss_scale" and isinstance(call, cst.Call) and not call.args:
            target = call
        elif method.attr.value == "_loss_scale" and not _is_store(self.names.parent(method), method):
            target = method
        else:
            raise Unfixable(f"`amp._amp_state` at line {self._line(node)} is apex internals the fix cannot map")
        scaler = self.access.expression(target)
        self.builder.replace(target, self.ctx.parse_expression(f"{scaler}.get_scale()"))
        self.handled.add(target)

    # ---- the scaler itself
    def _plan_scaler_creation(self) -> None:
        torch = self._torch(self.init_line)
        keywords = [f"{k}={v}" for k, v in self.spec.keywords]
        enabled = self.access.creation_enabled()
        if enabled:
            keywords.append(f"enabled={enabled}")
        args = [self.ctx.string("cuda").value, *keywords]
        creation = f"{self.access.home_expression()} = {torch}.amp.GradScaler({', '.join(args)})"
        indent = self._indentation(self.init_line)
        if len(indent) + len(creation) > _LINE_LENGTH:  # one argument a line, as black would
            # (continuation lines are relative to the statement's block: LibCST indents them there)
            creation = f"{self.access.home_expression()} = {torch}.amp.GradScaler(\n" + "".join(
                f"{self.module.default_indent}{a},\n" for a in args
            ) + ")"
        self._place_home(creation)
        self._disabled_default(torch)
        self._else_default(torch)

    def _else_default(self, torch: str) -> None:
        """`else: scaler = GradScaler("cuda", enabled=False)` for the `if` the scaler is made in
        (_scaler_access `_else_default_fits`): every later use finds a scaler, disabled where apex
        was not set up, as autocast then is (`enabled=scaler.is_enabled()`)."""
        statement = getattr(self.access, "else_default", None)
        if statement is None:
            return
        default = self.ctx.parse_statement(
            f"{self.access.home_expression()} = {torch}.amp.GradScaler({self.ctx.string('cuda').value}, enabled=False)\n"
        )
        indent = statement.body.indent if isinstance(statement.body, cst.IndentedBlock) else None

        def with_else(updated: cst.If) -> cst.If:
            return updated.with_changes(orelse=cst.Else(body=cst.IndentedBlock([default], indent=indent)))

        self.builder.replace(statement, with_else)
        self._note("the scaler is made where apex was set up, and disabled in a new `else:` of that `if`")

    def _indentation(self, statement: cst.CSTNode) -> str:
        """The whitespace before `statement`'s line: its blocks' indents, outermost first."""
        blocks = [a for a in self.names.ancestors(statement) if isinstance(a, cst.IndentedBlock)]
        return "".join(self.module.default_indent if b.indent is None else b.indent for b in reversed(blocks))

    def _place_home(self, creation: Optional[str]) -> None:
        """Replace the initialize line (keeping any rebinding it did) and create the scaler."""
        rebinding = self._rebinding()
        hoist = self.access.hoist_before if creation else None
        statements: List[str] = []
        statements.extend(getattr(self, "setup_guards", ()))
        if rebinding:
            statements.append(rebinding)
        if creation and getattr(self.access, "detached_init", None) is not None:
            self._place_detached(creation)
        elif creation and hoist is None:
            statements.append(creation)
        if statements:
            new = [self.ctx.parse_statement(s + "\n") for s in statements]
            new[0] = new[0].with_changes(leading_lines=self.init_line.leading_lines)
            self.builder.replace(self.init_line, cst.FlattenSentinel(new))
        else:
            self.removal.remove_statement(self.init_line)
        self.handled.add(self.init_line)
        keyword_dict = expanded_keywords(self.init.call)
        for statement in keyword_dict.statements if keyword_dict is not None else ():
            self.removal.remove_statement(statement)  # `amp_args = dict(...)`: only the call read it
            self.handled.add(statement)
        in_arm = creation if creation and hoist is None and getattr(self.access, "detached_init", None) is None else None
        self._place_alternative_lines(in_arm)  # _multi_init.py
        if hoist is not None:
            self.hoisted = (hoist, self.ctx.parse_statement(creation + "\n"))

    def _rebinding(self) -> Optional[str]:
        """`net, opt = amp.initialize(model, optimizer)` still has to bind `net, opt`."""
        if self.init.api == "init":
            return None  # `handle = amp.init()`: the handle's uses are rewritten instead
        return self._rebinding_of(self.init_line, self.init.call, self.spec)

    def _rebinding_of(self, line: cst.SimpleStatementLine, call: cst.Call, spec) -> Optional[str]:
        """What the line of `amp.initialize` (`call`) must still bind without it: apex returned the
        models and optimizers it was given (`optimizer_G = modelG.optimizer_G`), else None."""
        small = line.body[0]
        if not isinstance(small, cst.Assign):
            return None
        if _rebinds_its_arguments(small, call, self.names):
            return None  # `[model] = amp.initialize([model], ...)`
        target = small.targets[0].target
        values = [v for v in (spec.models, spec.optimizers) if v is not None]
        given = (bound_arguments(call, INITIALIZE_PARAMS) or {}).get("optimizers")
        if spec.optimizers is None and given is not None and isinstance(given.value, (cst.List, cst.Tuple)):
            values.append(given.value)  # `model, _ = amp.initialize(model, [])`: apex returned the `[]`
        if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(values):
            pairs = list(zip([e.value for e in target.elements], values))
        elif len(values) == 1:
            pairs = [(target, values[0])]
        else:
            raise Unfixable("the targets of `amp.initialize` do not match its models and optimizers")
        if all(expression_key(t) == expression_key(v) for t, v in pairs):
            return None
        if isinstance(target, (cst.Tuple, cst.List)) and all(isinstance(t, cst.Name) for t, _ in pairs):
            # Plain names bind independently: only those that change stay (`_ = []`).
            pairs = [(t, v) for t, v in pairs if expression_key(t) != expression_key(v)]
        left = ", ".join(self.ctx.code(t).strip() for t, _ in pairs)
        right = ", ".join(self.ctx.code(v).strip() for _, v in pairs)
        return f"{left} = {right}"

    # ------------------------------------------------------------------ fp32 (O0)
    def _plan_fp32(self, steps: List[Step]) -> None:
        for step in steps:
            loss_code = self.ctx.code(step.loss).strip()
            if not isinstance(step.loss, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                loss_code = f"({loss_code})"
            if step.binds_scaled is not None:
                self.builder.replace(step.with_node, self._bind_scaled(step, loss_code))
                self.handled.add(step.with_node)
                continue
            if step.backward_calls:
                self.builder.replace(step.with_node, self._unwrap_branched(step, loss_code))
                self.handled.add(step.with_node)
                continue
            args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in step.backward_args)
            line = self.ctx.parse_statement(f"{loss_code}.backward({args})\n")
            self.builder.replace(step.with_node, _then(line.with_changes(leading_lines=step.with_node.leading_lines), step.rest))
            self.handled.add(step.with_node)
        for ref in self.refs:
            if ref.api == "master_params":
                self._rewrite_master_params(ref)
            elif ref.api == "train_pass":
                raise Unfixable(
                    f"apex's amp module is handed to a training function of another file at line {self._line(ref.node)}; "
                    "under O0 no GradScaler is made here to hand it"
                )
            elif ref.api in ("state_dict", "load_state_dict", "_amp_state", "state_arg", "state_pass", "save_entry"):
                raise Unfixable(
                    f"`amp.{ref.api}` has no fp32 counterpart; remove it from the checkpoint code by hand"
                    if ref.api not in ("state_arg", "state_pass", "save_entry") else
                    f"apex's amp module is handed to a checkpoint loader at line {self._line(ref.node)}, which has no "
                    "fp32 counterpart; remove it from the checkpoint code by hand"
                )
            elif ref.api == "disable_casts":
                raise Unfixable("`amp.disable_casts` under O0 has nothing to disable; remove it by hand")
        self._plan_presence_tests()
        self._place_home(None)

    # ------------------------------------------------------------------ presence tests
    def _plan_presence_tests(self) -> None:
        """`amp is None`, `assert amp`, `if args.fp16 and amp is not None:`: apex is gone, torch.amp
        is always there (see _presence). Removals join the removal plan now; other rewrites wait
        until it is known which statements go anyway."""
        refs = self.presence_refs
        self.presence_actions: List[Action] = []
        present = self._presence_as_enabled() if any(r.api is None for r in self.refs) else None
        for ref in self.refs:
            if ref.api is not None:
                continue
            try:
                action = presence_action(self.names, ref.node, refs, present)
            except Unsupported as exc:
                raise Unfixable(f"`{self.ctx.code(ref.node)}` at line {self._line(ref.node)} is {exc}")
            if action.kind == "remove":
                self.removal.remove_statement(action.node)
            else:
                self.presence_actions.append(action)
            self.handled.add(action.node)

    def _presence_as_enabled(self):
        """`if cond: from apex import amp ... else: amp = None`: there `amp` is None where fp16 is off,
        not where apex is missing, so `if amp:` becomes `if scaler.is_enabled():` (when `cond` is part
        of the scaler's `enabled`), not `if True:` (which would run the fp16 arm in fp32 too)."""
        tests = [t for t in map(self._none_unless, self.usage.import_bindings) if t is not None]
        if not tests:
            return None
        access = getattr(self, "access", None)
        if access is None or getattr(self, "fp32", False):
            raise Unfixable(
                f"`amp` is None where `{self.ctx.code(tests[0]).strip()}` is false, and tests of it cannot be mapped here"
            )
        for test in tests:
            if (expression_key(test), True) not in access.enabled_keys:
                raise Unfixable(
                    f"`amp` is None where `{self.ctx.code(test).strip()}` is false, which is not the condition "
                    "the GradScaler is enabled under"
                )
        served = {id(scope.node) for scope in getattr(self, "scaler_scopes", ())}

        def present(ref: cst.CSTNode) -> cst.BaseExpression:
            if id(self._function_scope(ref).node) not in served:
                raise Unfixable(
                    f"`{self.ctx.code(ref).strip()}` at line {self._line(ref)} tests whether fp16 is on (apex.amp is "
                    "None otherwise) in a function the GradScaler is not passed to"
                )
            return self.ctx.parse_expression(f"{access.expression(ref)}.is_enabled()")

        return present

    def _none_unless(self, binding) -> Optional[cst.BaseExpression]:
        """The test of `if test: from apex import amp ... else: amp = None`, for this import binding."""
        child: cst.CSTNode = binding.node
        for ancestor in self.names.ancestors(binding.node):
            if isinstance(ancestor, cst.Try) and child is ancestor.body and _handlers_raise(ancestor):
                child = ancestor  # `try: from apex import amp` / `except ImportError: raise ...`: binds or leaves
                continue
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Try)):
                return None
            if isinstance(ancestor, cst.If) and child is ancestor.body and isinstance(ancestor.orelse, cst.Else):
                if none_assignments(body_of(ancestor.orelse.body) or (), {binding.name}):
                    return ancestor.test
            child = ancestor
        return None

    def _branches(self, node: cst.CSTNode, stop: cst.CSTNode) -> List[Branch]:
        """`branches`, with tests of apex's presence folded (`amp is not None` is now True): a
        branch that is now always taken is dropped, a test that mentions apex is simplified."""
        presence = self.presence_refs
        result: List[Branch] = []
        for branch in branches(self.names, node, stop=stop):
            if presence and any(n in presence for n in walk(branch.test)):
                try:
                    value = simplify(branch.test, presence)
                except Unsupported:
                    raise Unfixable(f"a test of apex at line {self._line(branch.test)} cannot be folded")
                if isinstance(value, bool):
                    if value != branch.taken:
                        raise Unfixable(f"code at line {self._line(node)} only runs where apex is missing")
                    continue
                branch = Branch(value, branch.taken, branch.statement)
            result.append(branch)
        return result

    @property
    def presence_refs(self) -> Set[cst.CSTNode]:
        return {r.node for r in self.refs if r.api is None}

    def _emit_presence(self, removed: Set[cst.CSTNode]) -> None:
        for action in getattr(self, "presence_actions", []):
            if action.node in removed or any(a in removed for a in self.names.ancestors(action.node)):
                continue
            if action.kind == "unwrap":
                self.builder.replace(action.node, unwrap(action.node, action.new))
            elif action.kind == "choose":
                self.builder.replace(action.node, choose(action.node, action.new))
            else:
                self.builder.replace(action.node, action.new)

    # ------------------------------------------------------------------ imports
    def _plan_imports(self) -> None:
        handled = set(self.handled)
        for binding in self.usage.import_bindings:
            if binding not in self.star_users_keep and unused_after(self.names, binding, handled):
                self.removal.remove_import_binding(binding)
        # Fallback bindings (`amp = None` in the except branch) are removed with their `try`.

    def _emit_removals(self) -> None:
        self._claim_import_uses()
        overrides = {}
        hoisted = getattr(self, "hoisted", None)
        removed = self.removal.closure()
        if hoisted is not None:
            anchor, creation = hoisted
            if anchor in removed:
                overrides[anchor] = creation.with_changes(leading_lines=anchor.leading_lines)
            else:
                self.builder.insert_before(anchor, creation)
        self._emit_presence(removed)
        self.removal.emit(self.builder, overrides, import_torch=getattr(self, "needs_torch_import", False))

    def _claim_import_uses(self) -> None:
        """An apex import this fix keeps for other apex uses waits for their fixes (_import_sequencing.py)."""
        handled = set(self.handled)
        amp_uses = {r.node for r in self.usage.refs}  # apex.amp's own (another setup's plan takes them)
        for binding in self.usage.import_bindings:
            if not unused_after(self.names, binding, handled):
                claim_other_uses(self.names, self.builder, binding, handled | amp_uses)

    def _check_nesting(self) -> None:
        targets = set(self.builder.targets())
        replaced = {n for n in self.builder.replaced() if not callable(self.builder.replacement(n))}
        for target in targets:
            for ancestor in self.names.ancestors(target):
                if ancestor in replaced:
                    raise Unfixable(
                        f"two parts of the migration overlap at line {self._line(target)} (the fix would have to "
                        "change a statement it also moves)"
                    )

    def _check_unreached_uses(self) -> None:
        """`from apex import amp` inside one method, `amp.scale_loss(...)` in another: there `amp`
        is bound nowhere (a NameError unless something outside the file sets a global). Removing
        the import as unused would erase the only sign of apex, so the fix stops and says where."""
        imported = {b.name for b in self.usage.import_bindings if b.scope is not self.names.module_scope}
        for name, scope in self.names.loads.items():
            if name.value in imported and not self.names.lookup(name.value, scope):
                parent = self.names.parent(name)
                what = f"`{name.value}.{parent.attr.value}`" if isinstance(parent, cst.Attribute) and parent.value is name else f"`{name.value}`"
                raise Unfixable(
                    f"{what} at line {self._line(name)} uses a name the apex import (in another function) does not "
                    "bind there: migrate that use by hand, with the GradScaler passed or stored where both can reach it"
                )

    def _check_star_users(self) -> None:
        """The module-level apex import of a module that other files reach through `from <it>
        import *` (engine/apex_star.py) goes only when each of them is migrated too."""
        from ampmigrate.rules.apex._star_users import users_problem

        bindings = [b for b in self.usage.import_bindings if b.scope is self.names.module_scope]
        problem = users_problem(self.ctx, [b.name for b in bindings]) if bindings else None
        if problem is None:
            return
        if not self.refs:
            raise Unfixable(f"other files reach this apex import through `*` imports: {problem}")
        # This file's own uses migrate; the import stays for the files that still read it (on a
        # current apex it fails, so a guarded import leaves them their `None`, as before the fix).
        self.star_users_keep = set(bindings)
        self._note(f"the apex import stays: other files reach it through `*` imports ({problem})")

    def _check_star_refs(self) -> None:
        """A name reached through `from apex.amp import *` has no import the fix could remove."""
        for ref in self.refs:
            root = ref.node
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name) and not self.names.bindings_of(root):
                if root.value == "apex" and self.names.qualified_names(root) == {"apex"}:
                    continue  # `apex` imported nowhere in the file (NameIndex._apex_free): no import to remove
                if self.names.star_bound.get(root.value) == "apex.amp":
                    # A star import of a module of the run (engine/apex_star.py): no import here.
                    from ampmigrate.rules.apex._star_users import importer_note

                    note = importer_note(self.ctx, self.names.star_bound)
                    if note:
                        self._note(note)
                    continue
                raise Unfixable(f"`{root.value}` comes from a `*` import; import it by name and the fix can follow it")

    # ------------------------------------------------------------------ helpers
    def _torch(self, at: cst.CSTNode) -> str:
        name, needs_import = self.ctx.module_reference(at, "torch")
        if name is None:
            if self.names.has_star_import:
                raise Unfixable("a star import (`from x import *`) may bind `torch` here; add `import torch` first")
            raise Unfixable("the name `torch` is taken in this file, so torch.amp cannot be spelled")
        if needs_import:
            self.needs_torch_import = True
        return name

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line


def _dotted(node: cst.BaseExpression) -> str:
    """`f` or `module.f` as spelled, else ""."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else ""
    return ""


def _initialize_key(call: cst.Call):
    """The arguments of an `amp.initialize` call, spelling-independent, when they bind cleanly."""
    bound = bound_arguments(call, INITIALIZE_PARAMS)
    if bound is None:
        return None
    return tuple(sorted((name, expression_key(arg.value)) for name, arg in bound.items()))


# Options two sibling calls may spell differently and still set apex up alike: `verbosity` only
# printed, and `None` is apex's default for these (its properties then come from the opt level).
_NONE_DEFAULTS = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights", "loss_scale")


def _options(key) -> tuple:
    """The options of an `_initialize_key`, without the models and optimizers, and without those
    that do not change the setup (`verbosity`, an explicit `None` default)."""
    none = expression_key(cst.Name("None"))
    return tuple(
        (name, value)
        for name, value in key
        if name not in ("models", "optimizers", "verbosity") and not (name in _NONE_DEFAULTS and value == none)
    )


def _initialize_keys(call: cst.Call, small: cst.BaseSmallStatement) -> list:
    """The keys a repeat of this call may have: the same arguments, or the models and optimizers
    it returned (`self.model, self.optimizer = amp.initialize(model, optimizer)`, then again with
    `self.model, self.optimizer`)."""
    key = _initialize_key(call)
    if key is None:
        return []
    keys = [key]
    target = small.targets[0].target if isinstance(small, cst.Assign) and len(small.targets) == 1 else None
    targets = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
    bound = bound_arguments(call, INITIALIZE_PARAMS) or {}
    given = [n for n in ("models", "optimizers") if n in bound]
    if target is not None and len(targets) == len(given):
        returned = dict(key)
        returned.update({n: expression_key(t) for n, t in zip(given, targets)})
        keys.append(tuple(sorted(returned.items())))
    return keys


def _rebinds_its_arguments(assign: cst.Assign, call: cst.Call, names=None) -> bool:
    """`self.model, self.optimizer = amp.initialize(self.model, self.optimizer, ...)`, also with
    lists (`[model] = amp.initialize([model], ...)`) and a discarded empty optimizer list
    (`model, _ = amp.initialize(model, [], ...)`, given the file's names to check that `_` is never read)."""
    bound = bound_arguments(call, INITIALIZE_PARAMS) or {}
    values = [bound[n].value for n in ("models", "optimizers") if n in bound]
    if len(assign.targets) != 1 or not values:
        return False
    target = assign.targets[0].target
    if len(values) == 2 and is_no_optimizers(values[1]):
        if _discards_empty_optimizers(target, values[1], names):
            target = target.elements[0].value  # `model, _ = amp.initialize(model, [])`
        values = values[:1]  # `model = amp.initialize(model, None, ...)`: no optimizers
    given = _shape_key(values[0]) if len(values) == 1 else tuple(_shape_key(v) for v in values)
    return _shape_key(target) == given


def _discards_empty_optimizers(target: cst.BaseExpression, optimizers: cst.BaseExpression, names) -> bool:
    """`model, _ = amp.initialize(model, [])`: apex returned the empty list it was given, bound to
    `_`; dropping the call leaves `_` unbound, which matters only where something reads `_`."""
    if names is None or not isinstance(optimizers, (cst.List, cst.Tuple)):
        return False
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
        return False
    throwaway = target.elements[1].value
    if not (isinstance(throwaway, cst.Name) and throwaway.value == "_"):
        return False
    return not any(names.references(b) for b in names.lookup("_", names.scope_of(throwaway)))


def _is_store(parent: cst.CSTNode, node: cst.CSTNode) -> bool:
    """`node` is written (an assignment target, augmented, annotated or deleted), not read."""
    if isinstance(parent, (cst.AssignTarget, cst.Del)):
        return True
    return isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node


def _shape_key(node: cst.BaseExpression):
    """`[a, (b, c)]` -> ('a', ('b', 'c')): the names a (possibly nested) list or tuple holds."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return tuple(_shape_key(e.value) for e in node.elements)
    return expression_key(node)


def _then(line: cst.SimpleStatementLine, rest: Sequence[cst.BaseStatement]):
    """The backward line, followed by the rest of the `with` body (one level out), as the fix has
    changed it (an `amp.master_params` in it is rewritten too)."""
    if not rest:
        return line

    def replacement(updated: cst.CSTNode) -> cst.CSTNode:
        body = updated.body
        statements = list(body.body[1:]) if isinstance(body, cst.IndentedBlock) else list(rest)
        return cst.FlattenSentinel([line, *statements])

    return replacement


def _blocks_of(statement: cst.CSTNode) -> List[cst.BaseSuite]:
    """The bodies of a compound statement: `if`/`elif`/`else`, loops' `else`, `try`'s handlers."""
    blocks: List[cst.BaseSuite] = []
    body = getattr(statement, "body", None)
    if isinstance(body, cst.BaseSuite):
        blocks.append(body)
    for part in (*getattr(statement, "handlers", ()), getattr(statement, "orelse", None), getattr(statement, "finalbody", None)):
        if isinstance(part, cst.If):
            blocks.extend(_blocks_of(part))
        elif part is not None and isinstance(getattr(part, "body", None), cst.BaseSuite):
            blocks.append(part.body)
    return blocks


_NOT_COMPUTE_BUILTINS = frozenset({"print", "len", "isinstance", "type", "str", "repr", "id", "getattr", "hasattr", "setattr"})
# Methods of a module that do not run its forward pass.
_MODEL_BOOKKEEPING = frozenset(
    {
        "eval", "train", "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "parameters",
        "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children",
        "state_dict", "load_state_dict", "requires_grad_", "zero_grad", "register_buffer", "apply",
    }
)


def _handlers_raise(node: cst.Try) -> bool:
    """A `try` with no `else:`/`finally:` whose every handler ends by raising."""
    if node.orelse is not None or node.finalbody is not None or not node.handlers:
        return False
    for handler in node.handlers:
        block = handler.body
        if isinstance(block, cst.IndentedBlock):
            block = block.body[-1] if block.body else None
        if not (isinstance(block, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and isinstance(block.body[-1], cst.Raise)):
            return False
    return True


def _runs_in_order(names, block: cst.CSTNode, function: cst.CSTNode) -> bool:
    """`block` is where a function's (or script's) statements run one after another: the
    function's body, or a script's `if __name__ == "__main__":` body."""
    parent = names.parent(block)
    return isinstance(block, cst.IndentedBlock) and (parent is function or (isinstance(parent, cst.If) and is_main_guard(parent)))

