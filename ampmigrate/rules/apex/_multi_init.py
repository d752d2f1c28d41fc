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
  default dynamic scale) the scaler is created in each arm;
- anything else keeps a reason that names what blocks it: the call whose arguments cannot be
  read, or the functions that each set apex up (one GradScaler per function is not built yet).

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.context import FixBuilder
from ampmigrate.rules.apex._amp_common import AmpPlan, Step, Unfixable
from ampmigrate.rules.apex._amp_options import INITIALIZE_PARAMS, bound_arguments, scaler_spec
from ampmigrate.rules.apex._amp_refs import AmpRef
from ampmigrate.rules.apex._flow import expression_key, walk

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
                f"`amp.initialize` sets apex up in {where}: each call makes its own loss scaler, and a "
                "GradScaler for each of these functions, threaded to the `amp.scale_loss` it serves, is not built yet"
            )
        return error

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
        for node in self._half_casts():
            if not (isinstance(node, cst.Call) or self._cast_argument(node)):
                continue  # a float16 dtype that makes a tensor or names autocast's dtype
            scope = self._function_scope(node)
            if id(scope.node) in homes:
                continue  # in a training step's function: its forward runs under the new autocast
            where = f"`{scope.node.name.value}()`" if isinstance(scope.node, cst.FunctionDef) else "the module's top level"
            raise Unfixable(
                f"line {self._line(node)} casts to half in {where}, outside the training steps the fix puts under "
                "autocast: apex's fp16 model took such inputs, the migrated fp32 model would not (wrap that code in "
                '`torch.autocast("cuda", dtype=torch.float16)` or drop the cast, by hand)'
            )

    def _cast_argument(self, node: cst.CSTNode) -> bool:
        """`x.to(torch.float16)`, `x.type(torch.HalfTensor)`: the dtype converts a value."""
        arg = self.names.parent(node)
        call = self.names.parent(arg) if isinstance(arg, cst.Arg) else None
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("to", "type")
            and arg.keyword is None
        )

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
        for name in ("models", "optimizers"):
            a, b = bound_first.get(name), bound_other.get(name)
            if (a is None) != (b is None) or (a is not None and expression_key(a.value) != expression_key(b.value)):
                return False
        if "optimizers" not in bound_first:
            return False
        first_spec = scaler_spec(self.module, self.names, first.call, self.ctx.quote)
        other_spec = scaler_spec(self.module, self.names, other.call, self.ctx.quote)
        if not _same_migration(first_spec, other_spec):
            return False
        if first_spec.enabled and not all(self._first_in_arm(self._init_line(r)) for r in (first, other)):
            return False  # `enabled=` is read before the `if` now: nothing in the arm may change it first
        return True

    def _arms_if(self, first: AmpRef, other: AmpRef) -> Optional[cst.If]:
        """The `if` whose two arms (`if`/`else`, not an `elif`) hold the two calls' lines directly."""
        found = []
        for ref in (first, other):
            block = self.names.parent(self._init_line(ref))
            holder = self.names.parent(block)
            if isinstance(holder, cst.Else):
                holder, arm = self.names.parent(holder), "orelse"
            else:
                arm = "body"
            if not isinstance(holder, cst.If) or (arm == "body" and holder.body is not block):
                return None
            found.append((holder, arm))
        (a, arm_a), (b, arm_b) = found
        if a is not b or arm_a == arm_b or not isinstance(a.orelse, cst.Else):
            return None
        return a

    def _first_in_arm(self, line: cst.CSTNode) -> bool:
        body = list(getattr(self.names.parent(line), "body", ()))
        return bool(body) and body[0] is line

    def _plan_alternatives(self, first: AmpRef, other: AmpRef) -> None:
        """The other arm's call goes (the caller removes its line); the scaler is created once,
        before the `if` (ScalerAccess reads `alternatives_if`), not under its condition."""
        self.alternatives_if = self._arms_if(first, other)
        spec = scaler_spec(self.module, self.names, other.call, self.ctx.quote)
        for note in spec.notes:
            self._note(note)
        self._note(
            f"`amp.initialize` at lines {self._line(first.call)} and {self._line(other.call)} are the two arms of the `if` "
            f"at line {self._line(self.alternatives_if)}, one setup at run time: one GradScaler, created before the `if`"
        )


def _falsy_literal(node: Optional[cst.BaseExpression]) -> bool:
    if isinstance(node, cst.Name):
        return node.value in ("False", "None")
    if isinstance(node, cst.Integer):
        return node.value == "0"
    return False


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
    if not first.levels or not other.levels or not (first.levels <= fp16 and other.levels <= fp16):
        return False
    if first.o3_test is not None or other.o3_test is not None or list(first.unsafe) != list(other.unsafe):
        return False
    return list(first.keywords) == list(other.keywords) and first.enabled_keys == other.enabled_keys
