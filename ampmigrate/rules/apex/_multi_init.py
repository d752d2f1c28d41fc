"""Several `amp.initialize` calls in one file, beyond repeats and same-block siblings.

apex semantics (AMP_FACTS.md section 4): each `amp.initialize` call builds apex's loss scalers
anew, and every later `amp.scale_loss` uses the ones the last call made. What the planner does
with several calls:

- every call is inference (no optimizers: an answer model and a rationale model evaluated one
  after the other): there is no loss scaler to keep, so each call is migrated as one inference
  setup is (its model's runs after it under `torch.autocast`, or the call goes and the note says
  the model runs in fp32);
- calls in the two arms of one `if`/`else` (an fp16 variant of the setup chosen by a flag), with
  the same models and optimizers: at run time only one of them runs, so they are one setup; when
  both become the same GradScaler and autocast (O1 and O2 both become fp16 autocast with the
  default dynamic scale) one scaler is created before the `if`, whose test is then no condition
  of it; the calls may sit below `if` statements of their own in each arm (`if amp_on:` in both,
  tests equal by `expression_key`, each first in its arm): their common tests give `enabled`. A
  call in the other arm under other tests is no re-initialization: it keeps a reason;
- anything else keeps a reason that names what blocks it: the call whose arguments cannot be
  read, or the functions that each set apex up (one GradScaler per function is not built yet).

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import Branch, branches, containing_block, elif_chain, expression_key, walk
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.context import FixBuilder
from ampmigrate.rules.apex._amp_common import AmpPlan, Step, Unfixable
from ampmigrate.rules.apex._amp_options import (
    INITIALIZE_PARAMS,
    bound_arguments,
    scaler_spec,
)
from ampmigrate.rules.apex._amp_refs import AmpRef
from ampmigrate.rules.apex._init_enclosure import reads_of, stores_in
from ampmigrate.rules.apex._regions import Region

SCALE_LOSS_PARAMS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")
MORE_THAN_ONCE = "`amp.initialize` is called more than once in this file"
HALF_TYPES = frozenset({"torch.float16", "torch.half", "torch.cuda.HalfTensor", "torch.HalfTensor"})


class MultiInits:
    # ---- every call is inference
    def _all_inference(self, inits: List[AmpRef]) -> bool:
        """Every call is `amp.initialize(model, ...)` without optimizers, at O1 or O2 (O0 and O3
        keep their own rules' paths), with arguments that bind cleanly."""
        for ref in inits:
            if ref.api != "initialize" or ref.call is None:
                return False
            spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote)
            if spec.error or spec.optimizers is not None or not spec.levels or not spec.levels <= {"O1", "O2"}:
                return False
        return True

    def _inference_fixes(self, plan: AmpPlan, inits: List[AmpRef]) -> Fix:
        """Each inference `amp.initialize` migrated as a lone one is: its model's runs after it in
        its block under `torch.autocast` (enabled as apex was), or else the call goes and its model
        runs in fp32 (the note says so). One fix for all, since the apex import goes with the last."""
        why_not = (
            "`amp.initialize` without optimizers is inference, and no statement after it in the same block "
            'runs the model: wrap the inference in `torch.autocast("cuda", dtype=torch.float16)` by hand'
        )
        if any(r.api not in (None, "initialize") for r in self.refs if r not in inits):
            raise Unfixable(why_not)
        self.fp32 = False
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        arms = self._inference_arms(inits)
        if arms is not None:
            return self._inference_arms_fix(plan, inits, arms, why_not)
        wrapped = False
        for init in inits:
            spec = scaler_spec(self.module, self.names, init.call, self.ctx.quote)
            self.spec, self.init, self.init_line = spec, init, self._init_line(init)
            if self._inference_autocast(init, spec, why_not):
                wrapped = True
                self.unsafe.extend(u for u in spec.unsafe if u not in self.unsafe)
                for note in spec.notes:
                    self._note(note)
            else:
                self._drop_inference_init(init)
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        lines = ", ".join(str(self._line(r.call)) for r in inits)
        if wrapped:
            return self._finish(f"Migrate the inference setups under apex.amp (lines {lines}) to torch.autocast fp16")
        return self._finish(f"Remove apex.amp's inference setups (lines {lines})")

    def _inference_arms(self, inits: List[AmpRef]) -> Optional[cst.If]:
        """The `if` whose `if`/`else` arms hold the two inference calls, each directly in its arm,
        both at the static level O1 with the same `enabled`: apex O1 patches torch's functions for
        the whole program whichever models it is given (none is cast), so whichever arm ran, every
        model run after the `if` ran in fp16 (PAT's `amp.initialize([model, lm_model, nsp_model])`
        or `amp.initialize([model, lm_model])` by a flag)."""
        if len(inits) != 2:
            return None
        arms = self._arms_if(*inits, same_conditions=False)
        if arms is None or any(self.names.parent(self.names.parent(self._init_line(r))) not in (arms, arms.orelse) for r in inits):
            return None
        specs = [scaler_spec(self.module, self.names, r.call, self.ctx.quote) for r in inits]
        if any(s.levels != {"O1"} or s.unsafe for s in specs):
            return None
        if len({tuple(c.code for c in s.enabled) for s in specs}) != 1:
            return None
        return arms

    def _inference_arms_fix(self, plan: AmpPlan, inits: List[AmpRef], arms: cst.If, why_not: str) -> Fix:
        """Both calls go, and the model runs after the `if` go under one `torch.autocast`: the
        models either call set up, enabled as both were (`_inference_arms`)."""
        models: Set[str] = set()
        for init in inits:
            self.spec, self.init, self.init_line = scaler_spec(self.module, self.names, init.call, self.ctx.quote), init, self._init_line(init)
            models |= self._initialized_names()
        if not self._inference_autocast(inits[0], self.spec, why_not, anchor=arms, models=models):
            raise Unfixable(why_not)
        for init in inits:
            self.init, self.init_line = init, self._init_line(init)
            self.spec = scaler_spec(self.module, self.names, init.call, self.ctx.quote)
            if self._rebinding() is not None:
                raise Unfixable(why_not + f" (the call at line {self._line(init.call)} binds other names than the models it is given)")
            self.removal.remove_statement(self.init_line)
            self.handled.add(self.init_line)
        for note in self.spec.notes:
            self._note(note)
        self._plan_presence_tests()
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        lines = " and ".join(str(self._line(r.call)) for r in inits)
        return self._finish(f"Migrate the inference setups under apex.amp (lines {lines}, one per arm) to torch.autocast fp16")

    # ---- a precise reason
    def _several_inits_reason(self, inits: List[AmpRef], error: Unfixable) -> Unfixable:
        """The generic "more than once" refusal, made to say what blocks the migration: a call
        whose arguments cannot be read, or the different functions that each set apex up."""
        if not str(error).startswith(MORE_THAN_ONCE):
            return error
        for ref in inits:
            if ref.api == "initialize" and ref.call is not None:
                spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote)
                if spec.error:
                    return Unfixable(
                        f"`amp.initialize` is called {len(inits)} times in this file, and the call at line "
                        f"{self._line(ref.call)} cannot be read: {spec.error}"
                    )
        if len(inits) == 2 and self._arms_if(*inits) is not None:
            first, other = inits
            return Unfixable(
                f"`amp.initialize` at lines {self._line(first.call)} and {self._line(other.call)}, the two arms of the "
                f"`if` at line {self._line(self._arms_if(first, other))}, set apex up with different models, optimizers or "
                "options (loss scaling, `enabled`): a GradScaler whose options each arm chooses is not built yet"
            )
        homes = {}
        for ref in inits:
            scope = self._function_scope(ref.call if ref.call is not None else ref.node)
            name = scope.node.name.value + "()" if isinstance(scope.node, cst.FunctionDef) else "the module's top level"
            homes.setdefault(id(scope.node), (name, []))[1].append(self._line(ref.call if ref.call is not None else ref.node))
        if len(homes) > 1:
            where = " and ".join(f"`{name}` (line {', '.join(map(str, lines))})" for name, lines in homes.values())
            return Unfixable(
                f"`amp.initialize` sets apex up in {where}: each call makes its own loss scaler, and one GradScaler "
                "per setup is built only where every call is an `amp.initialize` in a function"
            )
        return error

    def _without_o0_arms(self, inits: List[AmpRef]) -> List[AmpRef]:
        """`if not args.fp16: m, o = amp.initialize(m, o, opt_level="O0") else: m, o =
        amp.initialize(m, o, opt_level="O1")` (audio2score): O0 is apex's fp32 path, its call
        returns the model and optimizer it was given, and its loss scale is 1 (`scale_loss`
        changes nothing). Such a call, in the other arm of an `if` from the one fp16 call, on
        the same model and optimizer and with no option beyond the opt level, goes; the fp16
        call is then the setup, under its arm's test like any `if args.fp16:` setup."""
        from ampmigrate.rules.apex._amp_migration import _rebinds_its_arguments

        o0, others = [], []
        for ref in inits:
            spec = scaler_spec(self.module, self.names, ref.call, self.ctx.quote) if ref.call is not None else None
            (o0 if spec is not None and not spec.error and spec.levels == {"O0"} else others).append(ref)
        if not o0 or len(others) != 1 or others[0].api != "initialize" or others[0].call is None:
            return inits
        fp16 = others[0]
        for ref in o0:
            if ref.api != "initialize" or not _plain_o0_call(ref.call) or self._arms_if(fp16, ref) is None:
                return inits
            small = self._init_line(ref).body[0]
            if not (isinstance(small, cst.Assign) and _rebinds_its_arguments(small, ref.call, self.names)):
                return inits
            if _objects_key(ref.call) != _objects_key(fp16.call):
                return inits  # other models or optimizers than the fp16 arm's
        for ref in o0:
            self.removal.remove_statement(self._init_line(ref))
            self.handled.add(self._init_line(ref))
        self._note(
            "`amp.initialize` with opt_level O0 (apex's fp32 path, loss scale 1) at line "
            + ", ".join(str(self._line(r.call)) for r in o0)
            + " goes: the other arm's setup becomes a GradScaler enabled under that arm's test"
        )
        self.refs = [r for r in self.refs if r not in o0]
        return others

    # ---- casts to half
    def _half_casts(self) -> Iterator[cst.CSTNode]:
        """Each `.half()` call or float16 dtype of the file that may run (see `_never_runs`)."""
        for node in walk(self.module, into_scopes=True):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "half":
                if not self._never_runs(node):
                    yield node
            elif isinstance(node, cst.Attribute) and node.attr.value in ("float16", "half", "HalfTensor"):
                if self.names.qualified_names(node) & HALF_TYPES and not self._never_runs(node):
                    yield node

    def _check_half_inputs(self, steps: List[Step]) -> None:
        """apex trained an fp16 model (O2 casts it, O1 casts inside every patched function, also in
        evaluation); torch.amp keeps it fp32 and casts only inside the autocast regions the fix adds
        to the training steps. A `.half()` (`.to(torch.float16)`) elsewhere, as an evaluation loop's
        `inputs.half()` for the O2 model, would then meet fp32 weights: the fix stops and says where."""
        homes = {id(step.function.node) for step in steps}
        feeds: List[cst.SimpleStatementLine] = []
        for node in self._half_casts():
            cast = node if isinstance(node, cst.Call) else self._cast_argument(node)
            if cast is None:
                continue  # a float16 dtype that makes a tensor or names autocast's dtype
            scope = self._function_scope(node)
            if id(scope.node) in homes:
                continue  # in a training step's function: its forward runs under the new autocast
            if not self._feeds_a_model(cast) or self._follows_model_dtype(cast) or self._cast_in_region(cast):
                continue
            if self._own_half_network(cast):
                continue
            network_calls = self._network_cast(cast)
            statements = self._statements_of(network_calls) if network_calls else self._half_feed_statements(cast)
            if statements is None:
                where = f"`{scope.node.name.value}()`" if isinstance(scope.node, cst.FunctionDef) else "the module's top level"
                raise Unfixable(
                    f"line {self._line(node)} casts to half in {where}, outside the training steps the fix puts under "
                    "autocast: apex's fp16 model took such inputs, the migrated fp32 model would not (wrap that code in "
                    '`torch.autocast("cuda", dtype=torch.float16)` or drop the cast, by hand)'
                )
            feeds.extend(s for s in statements if s not in feeds)
        self._wrap_half_feeds(feeds)

    def _network_cast(self, cast: cst.Call) -> List[cst.Call]:
        """`self.teacher = self.teacher.half()`, `self.coarse_model = self.coarse_model.half()`: the
        value cast is the one it replaces, and the code calls it. The calls of that fp16 network
        (empty: not such a cast): each outside the training steps' regions goes under autocast,
        which takes whatever inputs the code gives it as apex's patched functions did."""
        if not (isinstance(cast.func, cst.Attribute) and cast.func.attr.value == "half" and not cast.args):
            return []
        node = self._derived_value(cast)
        assign = self.names.parent(node)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.value is node):
            return []
        target = assign.targets[0].target
        if expression_key(target) != expression_key(cast.func.value):
            return []
        if isinstance(target, cst.Name):
            loads = self._loads_of(target)
        elif isinstance(target, cst.Attribute):
            loads = self._self_attribute_loads(target) or []
        else:
            return []
        calls = [self.names.parent(load) for load in loads]
        calls = [c for c in calls if isinstance(c, cst.Call) and any(c.func is load for load in loads)]
        return [c for c in calls if not self._in_planned_region(c)] if calls else []

    def _own_half_network(self, cast: cst.Call) -> bool:
        """`net.half()` as a statement on a network the function builds itself (second.pytorch's
        evaluation: `net = build_network(...)`, then `if cfg.enable_mixed_precision: net.half()`):
        `Module.half()` converts in place, so that network is fp16 by the program's own choice, not
        apex's (none of `amp.initialize`'s models), and takes half inputs as it did."""
        statement = self.names.parent(cast)
        value = cast.func.value if isinstance(cast.func, cst.Attribute) else None
        if not (isinstance(statement, cst.Expr) and statement.value is cast and isinstance(value, cst.Name) and not cast.args):
            return False
        bindings = self.names.bindings_of(value)
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].scope is not self.names.scope_of(value):
            return False
        built = bindings[0].value
        while isinstance(built, cst.Call) and isinstance(built.func, cst.Attribute) and built.func.attr.value in ("to", "cuda", "eval"):
            built = built.func.value  # `build_network(cfg).to(device)`
        if not isinstance(built, cst.Call):
            return False
        return self._function_scope(value) is not getattr(self, "home", None)  # a fresh local: not apex's model

    def _statements_of(self, calls: List[cst.Call], half_name: Optional[str] = None) -> Optional[List[cst.SimpleStatementLine]]:
        """The statement of each call, where each can take a `with` of its own (see below). Where
        the scaler is out of reach (a `validate()` apart from the function making it) and the half
        value is the name `half_name`, the region is on exactly when that value is half:
        `enabled=<half_name>.dtype == torch.float16` (`half_feed_enabled`), as apex's fp16 model
        took it."""
        statements: List[cst.SimpleStatementLine] = []
        by_dtype: List[cst.SimpleStatementLine] = []
        for call in calls:
            line = next((a for a in self.names.ancestors(call) if isinstance(a, cst.BaseStatement)), None)
            if not isinstance(line, cst.SimpleStatementLine) or not isinstance(self.names.parent(line), cst.IndentedBlock):
                return None
            if self._in_planned_region(line):
                return None
            if not self._enabled_spellable(line):
                if half_name is None or not self._reads_unchanged(line, half_name):
                    return None
                by_dtype.append(line)
            statements.append(line)
        self.half_feed_enabled = {**getattr(self, "half_feed_enabled", {}), **{id(line): half_name for line in by_dtype}}
        return statements

    def _reads_unchanged(self, line: cst.SimpleStatementLine, name: str) -> bool:
        """`line` reads `name` as a plain local it does not also bind (the region's `enabled=`
        reads it before the statement runs)."""
        binds = any(
            isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.NamedExpr))
            and any(isinstance(t, cst.Name) and t.value == name for t in walk(getattr(n, "target", n)))
            for n in walk(line)
        )
        return not binds

    def _half_feed_statements(self, cast: cst.Call) -> Optional[List[cst.SimpleStatementLine]]:
        """The statements where the half value meets a network (`output = model(image)` after
        `image = batch.half().cuda() / 255` in an evaluation loop), each to run under autocast as
        apex O1/O2 ran it in fp16: the value an argument of a model-like call there, or assigned to
        a name whose reads in its function are. None where it goes elsewhere (stored on an object,
        returned) or such a statement cannot take a `with` of its own (on one line with its block's
        header, in a region already planned, or where the scaler the `enabled=` reads is not in
        reach)."""
        node = self._derived_value(cast)
        parent = self.names.parent(node)
        while isinstance(parent, cst.IfExp) and node is not parent.test:  # `x.half() if fp16 else x`
            node, parent = parent, self.names.parent(parent)
        calls: List[cst.Call] = []
        if isinstance(parent, cst.Arg) and self._model_like_call(self.names.parent(parent)):
            calls.append(self.names.parent(parent))
        else:
            target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
            if not isinstance(target, cst.Name):
                return None
            for load in self._loads_of(target):
                arg = self.names.parent(self._derived_value(load))  # `model(image.cuda())`
                if isinstance(arg, cst.Arg) and self._model_like_call(self.names.parent(arg)):
                    calls.append(self.names.parent(arg))
            return self._statements_of(calls, half_name=target.value) or None
        return self._statements_of(calls) or None

    def _enabled_spellable(self, at: cst.CSTNode) -> bool:
        """The new region's `enabled=` (the scaler's) can be written at `at`: none is needed, or
        the scaler is a local of the function setting apex up (read there, in a function nested
        in it, or as a module global) or an attribute of the class whose method reads it."""
        access = getattr(self, "access", None)
        if access is None or not hasattr(access, "conditions"):
            return False  # timm's shape (_timm_scaler.py) plans no scaler of its own
        if not access.conditions and access.default_init is None and access.carried(at) is None:
            return True
        scope = self._function_scope(at)
        if access.mode == "local":
            return scope is access.home or access._nested_in(scope, access.home) or access.home.kind == "module"
        if access.mode != "attribute" or scope.parent is None:
            return False
        return scope.parent is access.cls or self._subclass_of(scope.parent, access.cls)

    def _subclass_of(self, cls, base) -> bool:
        """`cls` names `base`, a top-level class of this file, among its bases: its methods see
        `self.<scaler>` too (CodeGen's `EncDecTrainer(Trainer)`)."""
        if cls.kind != "class" or base.parent is not self.names.module_scope:
            return False
        name = base.node.name.value
        bindings = self.names.module_scope.bindings.get(name, [])
        if len(bindings) != 1 or bindings[0].node is not base.node:
            return False
        return any(isinstance(b.value, cst.Name) and b.value.value == name and b.keyword is None for b in cls.node.bases)

    def _wrap_half_feeds(self, statements: List[cst.SimpleStatementLine]) -> None:
        """One autocast region per statement (_amp_forward.py), as the training steps get."""
        if not statements:
            return
        for line in statements:
            region = Region(containing_block(self.names, line), [line])
            self._emit_region(region)
            self.planned_regions = [*getattr(self, "planned_regions", ()), region]
        self._note(
            f"{len(statements)} evaluation statement{'s' if len(statements) > 1 else ''} feeding half inputs to a "
            "network outside the training steps run under autocast, as apex ran them in fp16"
        )

    def _cast_argument(self, node: cst.CSTNode) -> Optional[cst.Call]:
        """`x.to(torch.float16)`, `x.type(torch.HalfTensor)`: the call where the dtype converts a value."""
        arg = self.names.parent(node)
        call = self.names.parent(arg) if isinstance(arg, cst.Arg) else None
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("to", "type")
            and arg.keyword is None
        ):
            return call
        return None

    def _feeds_a_model(self, cast: cst.Call) -> bool:
        """The cast value goes, as an argument, to a call of something the code holds (a parameter,
        `self.model`, a local: `model(inputs)`, `model.infer(inputs)`), directly or through the
        name or instance attribute it is assigned to; not to a function or class it imports or
        defines (`torch.multinomial(self.probs, n)` samples indices, whatever the weights' dtype)."""
        node = self._derived_value(cast)
        parent = self.names.parent(node)
        if isinstance(parent, cst.Arg):
            return self._model_like_call(self.names.parent(parent))
        target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
        if isinstance(target, cst.Name):
            return self._name_feeds_a_model(target)
        if isinstance(target, cst.Attribute):
            loads = self._self_attribute_loads(target)
            if loads is not None:
                return any(self._load_feeds_a_model(load) for load in loads)
        return True  # stored elsewhere, returned or yielded: where it goes is not in sight

    def _name_feeds_a_model(self, target: cst.Name) -> bool:
        """A read of the name the cast value is assigned to in its function is an argument of a
        model-like call (a name's references are all its function's loads of it, rebindings
        included: `phi = phi.half()` then `torch.where(c, phi, x)`)."""
        for load in self._loads_of(target):
            arg = self.names.parent(load)
            if isinstance(arg, cst.Arg) and self._model_like_call(self.names.parent(arg)):
                return True
        return False

    def _derived_value(self, node: cst.CSTNode) -> cst.CSTNode:
        """The outermost expression computed from `node` alone or with other operands:
        `x.half().cuda()`, `probs[ids]`, `probs / probs.sum()`."""
        parent = self.names.parent(node)
        while (
            (isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node)
            or (isinstance(parent, cst.Call) and parent.func is node)
            or isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation))
        ):
            node, parent = parent, self.names.parent(parent)
        return node

    def _load_feeds_a_model(self, load: cst.CSTNode) -> bool:
        """A read of an instance attribute holding the cast value: an argument of a model-like
        call, or (what it computes) assigned to a name one of whose reads is. A read in a test, a
        comparison or a statement of its own feeds nothing; one returned, stored or put in a
        container may (True: out of sight)."""
        called = self.names.parent(load)
        if isinstance(called, cst.Call) and called.func is load:
            # the cast object run (`self.teacher = self.teacher.half()`, then `self.teacher(x)`): a
            # half model meets fp32 inputs unless autocast runs it
            return not self._in_planned_region(called)
        node = self._derived_value(load)
        parent = self.names.parent(node)
        if isinstance(parent, cst.Arg):
            return self._model_like_call(self.names.parent(parent))
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
            return self._name_feeds_a_model(parent.targets[0].target)
        return not isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.If, cst.While, cst.Expr, cst.IfExp))

    def _in_planned_region(self, node: cst.CSTNode) -> bool:
        for region in getattr(self, "planned_regions", ()):
            if any(node is n for statement in region.statements for n in walk(statement)):
                return True
        return False

    def _loads_of(self, target: cst.Name) -> List[cst.Name]:
        scope = self.names.scope_of(target)
        return [
            load
            for binding in self.names.lookup(target.value, scope)
            if binding.node is target
            for load in self.names.references(binding)
        ]

    def _self_attribute_loads(self, target: cst.Attribute) -> Optional[List[cst.Attribute]]:
        """Every read of `self.<attr>` in the methods of the class whose method assigns `target`,
        or None where the attribute may be read elsewhere (another object's, a subclass in
        another file) or is not an instance attribute of this file's class."""
        if not isinstance(target.value, cst.Name):
            return None
        cls = self.names.method_class_scope(target.value)
        if cls is None:
            return None
        name = target.attr.value
        store = self.names.statement_of(target)
        loads = []
        for node in walk(self.module, into_scopes=True):
            if not (isinstance(node, cst.Attribute) and node.attr.value == name) or node is target:
                continue
            if self.names.statement_of(node) is store:
                continue  # `self.probs = self.probs.half()`: the value before the cast
            if not isinstance(node.value, cst.Name) or self.names.method_class_scope(node.value) is not cls:
                return None  # `trainer.probs`, or a subclass's method: out of sight
            parent = self.names.parent(node)
            if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.AugAssign) and parent.target is node):
                continue  # another assignment, checked where it casts (or not a cast)
            loads.append(node)
        return loads

    def _model_like_call(self, call: Optional[cst.CSTNode]) -> bool:
        if not isinstance(call, cst.Call):
            return False
        root = call.func
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name):
            return True
        bindings = self.names.bindings_of(root)
        if not bindings:
            return False  # a builtin (`print`, `len`)
        return not any(b.kind in ("import", "from-import", "def", "class", "star-import") for b in bindings)

    def _follows_model_dtype(self, cast: cst.Call) -> bool:
        """The cast runs under a test of the model's own dtype (`if next(model.parameters()).type()
        == "torch.cuda.HalfTensor"`, or a flag set by such a test): with the model kept fp32 it no
        longer runs, as it did not under O1."""
        child: cst.CSTNode = cast
        for ancestor in self.names.ancestors(cast):
            if isinstance(ancestor, cst.If) and child is ancestor.body:
                if self._tests_parameter_dtype(ancestor.test):
                    return True
                for name in (n for n in walk(ancestor.test) if isinstance(n, cst.Name)):
                    assigned = [b for b in self.names.bindings_of(name) if b.kind == "assign"]
                    if assigned and all(self._set_under_dtype_test(b.statement) for b in assigned):
                        return True
            child = ancestor
        return False

    def _set_under_dtype_test(self, statement: Optional[cst.CSTNode]) -> bool:
        for ancestor in self.names.ancestors(statement) if statement is not None else ():
            if isinstance(ancestor, cst.If):
                return self._tests_parameter_dtype(ancestor.test)
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False

    def _tests_parameter_dtype(self, test: cst.BaseExpression) -> bool:
        nodes = list(walk(test))
        reads_parameters = any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "parameters" for n in nodes
        )
        names_half = any(
            (isinstance(n, cst.SimpleString) and "HalfTensor" in n.value)
            or (isinstance(n, cst.Attribute) and bool(self.names.qualified_names(n) & HALF_TYPES))
            for n in nodes
        )
        return reads_parameters and names_half

    # ---- a cast to half that never runs
    def _never_runs(self, node: cst.CSTNode) -> bool:
        """`node` (a `.half()` call, a float16 dtype) lies under `if flag:` where `flag` is a
        parameter of a top-level function whose every call in this file passes it a false literal
        (or leaves a false default): `def to_gray(half=False): ... if half: x = x.half()` with
        only `to_gray(False)` calls. The cast never runs here, so it feeds no model of this file."""
        child: cst.CSTNode = node
        for ancestor in self.names.ancestors(node):
            if isinstance(ancestor, cst.If) and child is ancestor.body and isinstance(ancestor.test, cst.Name):
                bindings = self.names.bindings_of(ancestor.test)
                if len(bindings) == 1 and bindings[0].kind == "param" and isinstance(bindings[0].statement, cst.FunctionDef):
                    if self._false_at_every_call(bindings[0].statement, bindings[0].name):
                        return True
            child = ancestor
        return False

    def _false_at_every_call(self, func: cst.FunctionDef, name: str) -> bool:
        if not isinstance(self.names.parent(func), cst.Module):
            return False  # a method or a nested function: its calls are not all in sight
        params = func.params
        if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
            return False  # `*args` / `**kwargs` may carry the flag
        positional = [*params.posonly_params, *params.params]
        index = next((i for i, p in enumerate(positional) if p.name.value == name), None)
        param = positional[index] if index is not None else next((p for p in params.kwonly_params if p.name.value == name), None)
        if param is None:
            return False
        calls = 0
        for load in self.names.loads:
            if load.value != func.name.value:
                continue
            bindings = self.names.bindings_of(load)
            if not any(b.node is func for b in bindings):
                continue
            if len(bindings) != 1:
                return False  # the name is rebound somewhere
            call = self.names.parent(load)
            if not isinstance(call, cst.Call) or call.func is not load:
                return False  # handed on as a value: its calls are not in sight
            if any(a.star for a in call.args):
                return False
            given = [a for a in call.args if a.keyword is None]
            by_keyword = [a for a in call.args if a.keyword is not None and a.keyword.value == name]
            if index is not None and index < len(given):
                value = given[index].value
            elif by_keyword:
                value = by_keyword[0].value
            else:
                value = param.default
            if not _falsy_literal(value):
                return False
            calls += 1
        return calls > 0

    # ---- one setup per function
    def _same_objects(self, first: AmpRef, other: AmpRef) -> bool:
        """`other` names the same model and optimizer objects as `first`: in the same function,
        or through `self.` attributes in methods of the same class, or module-level names (a local
        `model, optimizer` of another function is another model: another setup)."""
        home, there = self._function_scope(first.call), self._function_scope(other.call)
        if home is there:
            return True
        same_class = home.parent is there.parent and home.parent is not None and home.parent.kind == "class"
        bound = bound_arguments(other.call, INITIALIZE_PARAMS) or {}
        values = [bound[n].value for n in ("models", "optimizers") if n in bound]
        while values:
            value = values.pop()
            if isinstance(value, (cst.List, cst.Tuple)):
                values.extend(e.value for e in value.elements)
            elif isinstance(value, cst.Name):
                if any(b.scope is not self.names.module_scope for b in self.names.bindings_of(value)):
                    return False
            elif isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "self":
                if not same_class:
                    return False
            else:
                return False
        return True

    def _per_function_fix(self, plan: AmpPlan, inits: List[AmpRef], error: Unfixable) -> Fix:
        """`amp.initialize` in two functions (a learner's `fit()` and its `lr_find()`, a script's
        `train()` and `train_cdb()`): each call made apex's loss scaler anew for the training that
        follows it, so each function's setup gets its own GradScaler, planned as a lone setup would
        be, with the `amp.scale_loss` (`master_params`) that use its optimizer. Every other use must
        belong to exactly one setup, and the plans must not touch the same code differently."""
        reason = self._several_inits_reason(inits, error)
        groups = self._function_groups(inits)
        if groups is None:
            raise reason
        if type(self).__name__ != "_Planner":  # a side of a setup split across files (_cross_threading.py)
            names = " and ".join(f"`{name}`" for name, _ in groups)
            raise Unfixable(
                f"`amp.initialize` sets apex up in {names}, which hand their training (or checkpoints) to another "
                "file: one GradScaler per function, threaded across files, is not built yet"
            )
        merged = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        handled: Set[cst.CSTNode] = set()
        unsafe: List[str] = []
        messages: List[str] = []
        for name, refs in groups:
            sub = type(self)(self.ctx)
            sub.usage, sub.refs = self.usage, refs
            sub.handled |= handled  # the import goes once no setup's use is left
            sub_plan = AmpPlan(sites=[s for s in plan.sites if any(s.node is r.node for r in refs)])
            try:
                sub._build(sub_plan)
            except Unfixable as exc:
                raise Unfixable(f"the apex setup of `{name}` (one of {len(groups)} functions that call `amp.initialize`): {exc}")
            handled |= sub.handled
            plan.levels |= getattr(sub_plan, "levels", set())
            unsafe.extend(f"`{name}`: {u}" for u in sub.unsafe)
            messages.extend(f"`{name}`: {note}" for note in sub.notes)
            _merge(merged, sub.builder, self)
        self.builder = merged
        self._check_nesting()
        names = ", ".join(f"`{name}`" for name, _ in groups)
        details = [
            f"one GradScaler for each of {names}, as each `amp.initialize` call made apex's loss scaler anew",
            *messages,
            *([f"unsafe: {'; '.join(unsafe)}"] if unsafe else []),
        ]
        self.builder.message = "Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler (" + "; ".join(details) + ")"
        self.builder.applicability = UNSAFE if unsafe else SAFE
        return self.builder.build()

    def _function_groups(self, inits: List[AmpRef]) -> Optional[List[Tuple[str, List[AmpRef]]]]:
        """The refs of each function calling `amp.initialize`: its calls, and the uses in it or,
        elsewhere, on the optimizer only its call returned. None where a use fits no single one."""
        homes: Dict[int, Tuple[str, List[AmpRef], Set[str]]] = {}
        for ref in inits:
            if ref.api != "initialize" or ref.call is None:
                return None
            scope = self._function_scope(ref.call)
            if not isinstance(scope.node, cst.FunctionDef):
                return None
            name = f"{scope.node.name.value}()"
            entry = homes.setdefault(id(scope.node), (name, [], set()))
            entry[1].append(ref)
            entry[2].update(self._optimizer_keys(ref))
        if len(homes) < 2:
            return None
        for ref in self.refs:
            if ref in inits:
                continue
            functions = " and ".join(f"`{name}`" for name, _, _ in homes.values())
            if ref.api in (None, "pass") or ref.call is None:
                raise Unfixable(
                    f"`amp.initialize` sets apex up in {functions}, and line {self._line(ref.node)} tests or hands on "
                    "the amp module itself: which of their GradScalers it stands for is unclear"
                )
            scope = self._function_scope(ref.node)
            if id(scope.node) in homes:
                homes[id(scope.node)][1].append(ref)
                continue
            optimizer = self._used_optimizer(ref)
            owners = [entry for entry in homes.values() if optimizer is not None and optimizer in entry[2]]
            if len(owners) != 1:
                raise Unfixable(
                    f"`amp.initialize` sets apex up in {functions}, each with its own GradScaler now, and "
                    f"`amp.{ref.api}` at line {self._line(ref.node)} (outside them) served whichever ran last: "
                    "pass it the GradScaler it needs by hand"
                )
            owners[0][1].append(ref)
        return [(name, refs) for name, refs, _ in homes.values()]

    def _optimizer_keys(self, ref: AmpRef) -> Set[str]:
        """The optimizer an `amp.initialize` call takes, and the name its result is bound to."""
        bound = bound_arguments(ref.call, INITIALIZE_PARAMS) or {}
        keys: Set[str] = set()
        given = bound.get("optimizers")
        if given is None:
            return keys
        keys.add(expression_key(given.value))
        small = self._init_line(ref).body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
                keys.add(expression_key(target.elements[1].value))
        return keys

    def _rebinds_own_optimizer(self, ref: AmpRef) -> bool:
        """`model, opt = amp.initialize(model, opt, ...)`: the result's optimizer goes back to the
        expression passed (a name or an attribute), so the call changes what no name means."""
        bound = bound_arguments(ref.call, INITIALIZE_PARAMS) or {}
        given = bound.get("optimizers")
        if given is None or not isinstance(given.value, (cst.Name, cst.Attribute)):
            return False
        small = self._init_line(ref).body[0]
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
            return False
        target = small.targets[0].target
        return (
            isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2
            and expression_key(target.elements[1].value) == expression_key(given.value)
        )

    def _used_optimizer(self, ref: AmpRef) -> Optional[str]:
        if ref.api == "scale_loss":
            bound = bound_arguments(ref.call, SCALE_LOSS_PARAMS) or {}
            given = bound.get("optimizers")
            return expression_key(given.value) if given is not None else None
        if ref.api == "master_params" and len(ref.call.args) == 1 and ref.call.args[0].keyword is None:
            return expression_key(ref.call.args[0].value)
        return None

    # ---- alternatives in the arms of one `if`
    def _alternative_initialize(self, first: AmpRef, other: AmpRef) -> bool:
        """`if a: m, o = amp.initialize(m, o, opt_level="O2") else: m, o = amp.initialize(m, o)`:
        the same models and optimizers, each call directly in one arm of the same `if` (only one
        runs), both becoming the same GradScaler and autocast."""
        if first.call is None or other.call is None or first.api != "initialize" or other.api != "initialize":
            return False
        if self._arms_if(first, other) is None:
            return False
        bound_first = bound_arguments(first.call, INITIALIZE_PARAMS) or {}
        bound_other = bound_arguments(other.call, INITIALIZE_PARAMS) or {}
        first_spec = scaler_spec(self.module, self.names, first.call, self.ctx.quote)
        other_spec = scaler_spec(self.module, self.names, other.call, self.ctx.quote)
        # O1 leaves the models as they are (apex patched torch's functions, not the models): arms
        # that differ only in which models they list (`[model, teacher]` in one) are one setup.
        # Under O2 apex cast the models each arm lists to fp16 (the others ran in fp32): arms
        # spelling the same models otherwise (`[student] + list(teachers)`, `[student, teachers]`)
        # are one setup too. The forward passes of every arm's models go under autocast
        # (`alternative_models`).
        o1_only = first_spec.levels == other_spec.levels == {"O1"}
        for name in ("models", "optimizers"):
            a, b = bound_first.get(name), bound_other.get(name)
            if name == "models" and a is not None and b is not None:
                if o1_only or self._same_model_roots(first, other) or self._models_apart_by_none(first, other):
                    continue
                return False
            if name == "optimizers" and a is not None and b is not None and (
                o1_only or self._optimizers_apart_by_test(first, other)
            ):
                # O1 patches torch, not the optimizers' parameters (no fp32 master copies): one
                # GradScaler serves whichever optimizers the training steps name, listed in either arm
                # (`[optimizer, optimizer_center]` where a center loss trains too).
                continue
            if name == "optimizers" and a is not None and b is not None and self._rebinds_own_optimizer(first) and self._rebinds_own_optimizer(other):
                # `o.optimizer = amp.initialize(m, o.optimizer)` in one arm, `o = amp.initialize(m, o)` in
                # the other (a scheduler wrapper or the bare optimizer): apex patches each in place and
                # returns it, and one GradScaler serves whichever optimizer the training step names.
                continue
            if (a is None) != (b is None) or (a is not None and expression_key(a.value) != expression_key(b.value)):
                return False
        if "optimizers" not in bound_first:
            return False
        if not _same_migration(first_spec, other_spec):
            return False
        outer = self._arms_if(first, other)
        inner = self._inner_conditions(first, outer)
        if (first_spec.enabled or inner) and not all(self._leads_its_arm(r, outer) for r in (first, other)):
            return False  # `enabled=` and the arms' own tests are read before the `if` now: nothing may change them first
        if inner and any(isinstance(n, cst.NamedExpr) for n in walk(outer.test)):
            return False  # the outer test binds a name the arms' tests may read
        return True

    def _same_model_roots(self, first: AmpRef, other: AmpRef) -> bool:
        roots = [self._model_roots(ref) for ref in (first, other)]
        return bool(roots[0]) and roots[0] == roots[1]

    def _optimizers_apart_by_test(self, first: AmpRef, other: AmpRef) -> bool:
        """`if dis_optimizer: model, [opt, dis_opt] = amp.initialize(model, [opt, dis_opt],
        num_losses=2) else: model, opt = amp.initialize(model, opt, num_losses=1)` (a GAN whose
        discriminator is optional): the arms list the same optimizers but the one the `if` tests
        (`if x:`, `if x is not None:`), which the arm leaving it out does not have. One GradScaler
        serves whichever optimizers the training steps name, so they are one setup."""
        outer = self._arms_if(first, other)
        test = outer.test if outer is not None else None
        set_arm = "body"
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, set_arm = test.expression, "orelse"
        if (
            isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
            and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"
        ):
            if set_arm == "orelse":
                return False
            set_arm = "body" if isinstance(test.comparisons[0].operator, cst.IsNot) else "orelse"
            test = test.left
        tested = _dotted_name(test) if test is not None else None
        if tested is None:
            return False
        arms = {_arm(outer, list(self.names.ancestors(self._init_line(ref)))): ref for ref in (first, other)}
        if set(arms) != {"body", "orelse"}:
            return False

        def listed(ref: AmpRef) -> Optional[Set[str]]:
            value = bound_arguments(ref.call, INITIALIZE_PARAMS)["optimizers"].value
            elements = [e.value for e in value.elements] if isinstance(value, (cst.List, cst.Tuple)) else [value]
            keys = [_dotted_name(e) for e in elements]
            return None if None in keys or len(set(keys)) != len(keys) else set(keys)

        with_it = listed(arms[set_arm])
        without = listed(arms["orelse" if set_arm == "body" else "body"])
        return with_it is not None and without is not None and with_it - without == {tested} and without <= with_it

    def _models_apart_by_none(self, first: AmpRef, other: AmpRef) -> bool:
        """`if model_old is not None: [model, model_old], opt = amp.initialize([model, model_old],
        opt, ...) else: model, opt = amp.initialize(model, opt, ...)` (an optional teacher or old
        model): the arms list the same models but the one the `if` tests, which is None in the arm
        that leaves it out, so no model runs uncast in one arm that the other cast."""
        outer = self._arms_if(first, other)
        test = outer.test if outer is not None else None
        if not (
            isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
            and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"
        ):
            return False
        tested = _dotted_name(test.left)
        if tested is None:
            return False
        set_arm = "body" if isinstance(test.comparisons[0].operator, cst.IsNot) else "orelse"
        arms = {_arm(outer, list(self.names.ancestors(self._init_line(ref)))): ref for ref in (first, other)}
        if set(arms) != {"body", "orelse"}:
            return False
        with_it = self._model_roots(arms[set_arm])
        without = self._model_roots(arms["orelse" if set_arm == "body" else "body"])
        return with_it is not None and without is not None and with_it - without == {tested} and without <= with_it

    def _model_roots(self, ref: AmpRef) -> Optional[Set[str]]:
        """The names and attribute chains the `models` argument is built from, following names
        assigned earlier in the call's block (`models = [self.student] + list(self.teachers)`):
        {"self.student", "self.teachers"}; None where a part cannot be read so."""
        line = self._init_line(ref)
        block = self.names.parent(line)
        earlier = list(getattr(block, "body", ()))
        earlier = earlier[: earlier.index(line)] if line in earlier else []
        models = bound_arguments(ref.call, INITIALIZE_PARAMS)["models"].value

        def assigned(name: str) -> Optional[cst.BaseExpression]:
            for statement in reversed(earlier):
                for small in getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ():
                    if isinstance(small, cst.Assign) and any(
                        name in _target_names(t.target) for t in small.targets
                    ):
                        return small.value
            return None

        def roots(node: cst.BaseExpression, hops: int) -> Optional[Set[str]]:
            found: Set[str] = set()
            for leaf in _value_leaves(node):
                if isinstance(leaf, cst.Name) and hops:
                    value = assigned(leaf.value)
                    if value is not None:
                        inner = roots(value, hops - 1)
                        if inner is None:
                            return None
                        found |= inner
                        continue
                if isinstance(leaf, (cst.SimpleString, cst.Integer, cst.Float)):
                    continue  # `model.to("cuda")`: a constant is no model
                dotted = _dotted_name(leaf)
                if dotted is None:
                    return None
                found.add(dotted)
            return found

        return roots(models, 2)

    def _arms_if(self, first: AmpRef, other: AmpRef, same_conditions: bool = True) -> Optional[cst.If]:
        """The `if` whose two arms (`if`/`else`, not an `elif`) hold the two calls' lines, directly
        or below `if` statements of their own (`if amp_on:` in each arm) whose tests are equal, so
        that the calls run under the same conditions below it: exactly one of them runs."""
        lines = [self._init_line(ref) for ref in (first, other)]
        chains = [list(self.names.ancestors(line)) for line in lines]
        other_ids = {id(node) for node in chains[1]}
        outer = next((a for a in chains[0] if isinstance(a, cst.If) and id(a) in other_ids), None)
        if outer is None or outer.orelse is None:
            return None
        if {_arm(outer, chain) for chain in chains} != {"body", "orelse"}:
            return None
        for chain in chains:
            for node in chain:
                if node is outer:
                    break
                if not isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite, cst.If, cst.Else)):
                    return None  # a loop, a `with`, a `try` between: not one plain choice
        if same_conditions:
            keys = [[b.key for b in self._arm_conditions(line, outer)] for line in lines]
            if keys[0] != keys[1]:
                return None
        return outer

    def _arm_conditions(self, line: cst.CSTNode, outer: cst.If) -> List[Branch]:
        """The tests `line` runs under within its arm of `outer`'s `if`/`elif`/`else` chain (the
        chain's own tests choose the arm: one arm's call runs whichever it is)."""
        links = {id(link) for link in elif_chain(outer)}
        return [b for b in branches(self.names, line, stop=outer) if id(b.statement) not in links]

    def _check_not_an_other_arm(self, first: AmpRef, other: AmpRef) -> None:
        """A call in the other arm of an `if` from the first is no re-initialization after it (it
        runs instead of it): unless the two are alternatives under the same conditions, the
        scaler's `enabled` would follow the first arm's conditions only."""
        outer = self._arms_if(first, other, same_conditions=False)
        if outer is None:
            return
        where = f"`amp.initialize` at lines {self._line(first.call)} and {self._line(other.call)}, the two arms of the `if` at line {self._line(outer)},"
        inner = [self._inner_conditions(ref, outer) for ref in (first, other)]
        if [b.key for b in inner[0]] != [b.key for b in inner[1]]:
            tests = [
                " and ".join(("" if b.taken else "not ") + f"`{self.ctx.code(b.test).strip()}`" for b in branches) or "no test"
                for branches in inner
            ]
            raise Unfixable(
                f"{where} run under different conditions within their arms ({tests[0]}; {tests[1]}): a GradScaler "
                "created before the `if` would follow one arm's conditions only"
            )
        raise Unfixable(
            f"{where} are no alternatives the fix follows (fp16 levels only, each call and its arm's tests first in "
            "the arm, no name bound in the `if`'s test): a GradScaler created before the `if` is not proven to match"
        )

    def _inner_conditions(self, ref: AmpRef, outer: cst.If) -> List[Branch]:
        return self._arm_conditions(self._init_line(ref), outer)

    def _leads_its_arm(self, ref: AmpRef, outer: cst.If) -> bool:
        """Nothing in the arm before the call (and before each `if` enclosing it below `outer`)
        writes a name or attribute that its options or its arm's tests read: a scaler created
        before `outer` now reads them there (`models = [student, *teachers]` may come first)."""
        line = self._init_line(ref)
        reads: Set[str] = set()
        for arg in ref.call.args:
            if arg.keyword is None or arg.keyword.value not in ("models", "optimizers"):
                if not (arg.keyword is None and arg is ref.call.args[0]):
                    reads |= reads_of(arg.value)
        for branch in self._inner_conditions(ref, outer):
            reads |= reads_of(branch.test)
        node = line
        while node is not outer:
            parent = self.names.parent(node)
            if isinstance(parent, cst.If):  # an `elif`: its chain's earlier tests ran first
                node = parent
                continue
            body = list(getattr(parent, "body", ()))
            if node not in body:
                return False
            for earlier in body[: body.index(node)]:
                written = stores_in(earlier)
                if any(r == w or r.startswith(w + ".") or w.startswith(r + ".") for r in reads for w in written):
                    return False
                if any(isinstance(n, (cst.Return, cst.Raise, cst.Break, cst.Continue)) for n in walk(earlier)):
                    return False  # the arm may leave before the call
            holder = self.names.parent(parent)
            if isinstance(holder, cst.Else):
                holder = self.names.parent(holder)
            node = holder
        return True

    def _defers_alternative(self, first: AmpRef, other: AmpRef, line: cst.CSTNode, rebinding: Optional[str]) -> bool:
        """The other arm's line is replaced when the home's is (`_place_alternative_lines`): by
        the same guards (a run-time `opt_level`'s O3, ...), what it must still bind (`models =
        [student, *teachers]`: apex returned the list it was given), and the scaler's creation
        where the scaler is made in the first arm rather than before the `if`."""
        self.alternative_lines = [*getattr(self, "alternative_lines", ()), (line, rebinding)]
        return True

    def _place_alternative_lines(self, creation: Optional[str]) -> None:
        """`creation`: the statement making the scaler in the first arm, or None (made before
        the `if`, or in `__init__`): each arm then makes it as the first does."""
        for line, rebinding in getattr(self, "alternative_lines", ()):
            if line in self.handled:
                continue
            texts = [*getattr(self, "setup_guards", ()), *([rebinding] if rebinding else []), *([creation] if creation else [])]
            statements = [self.ctx.parse_statement(t + "\n") for t in texts]
            if not statements:
                self.removal.remove_statement(line)
            else:
                statements[0] = statements[0].with_changes(leading_lines=line.leading_lines)
                self.builder.replace(line, cst.FlattenSentinel(statements))
            self.handled.add(line)

    def _check_alternative_placed(self) -> None:
        for line, _ in getattr(self, "alternative_lines", ()):
            if line not in self.handled:
                raise Unfixable(
                    f"`amp.initialize` at line {self._line(line)}, the other arm's setup, is left with nothing to become"
                )

    def _plan_alternatives(self, first: AmpRef, others: List[AmpRef]) -> None:
        """The other arms' calls go (the caller removes their lines); the scaler is created once,
        before the `if` (ScalerAccess reads `alternatives_if`), not under its condition."""
        self.alternatives_if = self._arms_if(first, others[0])
        self.alternative_models = [bound_arguments(r.call, INITIALIZE_PARAMS)["models"].value for r in others]
        for other in others:
            for note in scaler_spec(self.module, self.names, other.call, self.ctx.quote).notes:
                if note not in self.notes:
                    self._note(note)
        lines = [self._line(r.call) for r in (first, *others)]
        self._note(
            f"`amp.initialize` at lines {', '.join(map(str, lines[:-1]))} and {lines[-1]} are the arms of the `if` "
            f"at line {self._line(self.alternatives_if)}, one setup at run time: one GradScaler, made alike whichever arm runs"
        )

    def alternatives_apart(self, first: AmpRef, alternatives: List[AmpRef]) -> bool:
        """Each call in an arm of its own of one `if`/`elif`/`else` chain: one runs, whichever."""
        outers = {id(self._arms_if(first, r)) for r in alternatives}
        if len(outers) != 1:
            return False
        return all(
            self._arms_if(a, b) is not None for i, a in enumerate(alternatives) for b in alternatives[i + 1:]
        )


def _merge(into: FixBuilder, other: FixBuilder, planner) -> None:
    """Add `other`'s changes to `into`: the same change twice counts once, two different changes
    of one node stop the fix."""

    def same(a, b) -> bool:
        if a is b:
            return True
        if isinstance(a, cst.CSTNode) and isinstance(b, cst.CSTNode):
            return a.deep_equals(b)
        if isinstance(a, cst.FlattenSentinel) and isinstance(b, cst.FlattenSentinel):
            return len(a.nodes) == len(b.nodes) and all(x.deep_equals(y) for x, y in zip(a.nodes, b.nodes))
        return False

    for node in other.replaced():
        new = other.replacement(node)
        if into.replaces(node):
            if not same(into.replacement(node), new):
                raise Unfixable(
                    f"the setups of two functions would change line {planner._line(node)} differently"
                )
            continue
        into.replace(node, new)
    for mine, theirs, insert in ((into._before, other._before, into.insert_before), (into._after, other._after, into.insert_after)):
        for node, statements in theirs.items():
            have = mine.get(node, [])
            insert(node, *[s for s in statements if not any(same(s, h) for h in have)])
    for module in other._imports:
        into.require_import(module)


def _falsy_literal(node: Optional[cst.BaseExpression]) -> bool:
    if isinstance(node, cst.Name):
        return node.value in ("False", "None")
    if isinstance(node, cst.Integer):
        return node.value == "0"
    return False


def _target_names(target: cst.BaseExpression) -> Set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _target_names(e.value)}
    return set()


def _value_leaves(node: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The objects an expression is built from: names and attribute chains, not the functions
    it calls (`list(teachers)` -> `teachers`; `teachers.items()` -> `teachers`)."""
    if isinstance(node, (cst.Name, cst.Attribute)) and _dotted_name(node) is not None:
        yield node
    elif isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute):
            yield from _value_leaves(node.func.value)
        for arg in node.args:
            yield from _value_leaves(arg.value)
    elif isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        for element in node.elements:
            yield from _value_leaves(element.value)
    elif isinstance(node, cst.BinaryOperation):
        yield from _value_leaves(node.left)
        yield from _value_leaves(node.right)
    else:
        yield node  # a subscript, a comprehension...: not read here (`_dotted_name` says None)


def _dotted_name(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted_name(node.value)
        return f"{inner}.{node.attr.value}" if inner is not None else None
    return None


def _arm(statement: cst.If, chain: List[cst.CSTNode]) -> Optional[str]:
    """Which arm of `statement` the ancestor chain passes through ("body" or "orelse")."""
    for node in chain:
        if node is statement.body:
            return "body"
        if node is statement.orelse:
            return "orelse"
    return None


def _same_migration(first, other) -> bool:
    """Two calls' specs give the same GradScaler and the same autocast: fp16 levels only (O1/O2),
    the same scaler keywords and `enabled` conditions, and nothing that makes either unsafe."""
    if first is None or other is None or first.error or other.error:
        return False
    fp16 = {"O1", "O2"}
    if first.o3_test is not None:
        if first.levels != other.levels or first.opt_level_code != other.opt_level_code:
            return False
    elif not first.levels or not other.levels or not (first.levels <= fp16 and other.levels <= fp16):
        return False
    if first.o3_test != other.o3_test or first.guards != other.guards or list(first.unsafe) != list(other.unsafe):
        return False  # a run-time `opt_level` only where both calls read the same one
    return list(first.keywords) == list(other.keywords) and first.enabled_keys == other.enabled_keys


def _plain_o0_call(call: cst.Call) -> bool:
    """Nothing but the models, optimizers, an opt level and verbosity: `loss_scale=` or
    `enabled=` would make O0 do more than return what it was given."""
    bound = bound_arguments(call, INITIALIZE_PARAMS)
    return bound is not None and set(bound) <= {"models", "optimizers", "opt_level", "verbosity"}


def _objects_key(call: cst.Call):
    """The models and optimizers an `amp.initialize` call is given, spelling-independent."""
    bound = bound_arguments(call, INITIALIZE_PARAMS) or {}
    if "models" not in bound or "optimizers" not in bound:
        return None
    return tuple(expression_key(bound[n].value) for n in ("models", "optimizers"))
