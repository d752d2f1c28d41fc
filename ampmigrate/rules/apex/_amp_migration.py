"""The apex.amp migration of one file, planned once and shared by AMP101-AMP104.

A partial apex migration leaves code that does not run, so everything the file does with
apex.amp changes in one fix: `amp.initialize` becomes a `torch.amp.GradScaler`, each
`with amp.scale_loss(loss, opt) as s: s.backward()` becomes `scaler.scale(loss).backward()`, the
`opt.step()` after it `scaler.step(opt)` + `scaler.update()`, gradient reads between the two
(a clip, `amp.master_params`) get `scaler.unscale_(opt)` first, the forward pass and loss go under
`torch.autocast("cuda", dtype=torch.float16)`, `amp.state_dict()` / `amp.load_state_dict()` move
to the scaler, and the apex import goes. Under O0 (fp32) the same uses become plain fp32 code.

The scaler lives where `amp.initialize` was: a local (`scaler`), `self.scaler` when other methods
of the class use it, or a parameter added to the module-level functions that the initializing
function calls (the way people migrate by hand). When `amp.initialize` ran under a condition
(`if args.fp16:`), the scaler is created before it with `enabled=<condition>`: a disabled scaler
passes `step` through to the optimizer, so the fp32 path keeps working unchanged.

Anything the plan cannot follow stops it with a reason (`_Unfixable`); the findings are then
reported without a fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.api import (
    APEX_AMP_CAST_ANNOTATIONS,
    CLIP_GRAD,
    TORCH_AMP_GRAD_SCALER_SINCE,
    format_version,
)
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args
from ampmigrate.engine.names import Binding, Scope
from ampmigrate.rules.apex._amp_options import ScalerSpec, bound_arguments, literal_value, scaler_spec
from ampmigrate.rules.apex._amp_refs import AmpRef, AmpUsage, amp_usage
from ampmigrate.rules.apex._flow import (
    Branch,
    body_of,
    branches,
    condition_code,
    containing_block,
    expression_key,
    following,
    is_pure,
    loops_between,
    walk,
)
from ampmigrate.rules.apex._presence import Action, Unsupported, presence_action, simplify, unwrap
from ampmigrate.rules.apex._regions import NoRegion, Region, autocast_regions, merge
from ampmigrate.rules.apex._removal import Removal, unused_after

CODE = "AMP101"
O3_CODE = "AMP102"
O0_CODE = "AMP103"
HANDLE_CODE = "AMP104"

SCALE_LOSS_PARAMS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")
SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")
_AMP = "apex.amp"


class _Unfixable(Exception):
    """Raised while planning; the message says why, for the user."""


@dataclass(eq=False)
class Site:
    node: cst.CSTNode
    code: str
    api: str


@dataclass
class AmpPlan:
    sites: List[Site] = field(default_factory=list)
    fix: Optional[Fix] = None
    reason: Optional[str] = None
    levels: Set[str] = field(default_factory=set)


def amp_plan(ctx: FileContext) -> AmpPlan:
    return ctx.shared("apex.amp_plan", lambda: _Planner(ctx).plan())


# ------------------------------------------------------------------------------ per-step analysis
@dataclass(eq=False)
class _Step:
    """One `with amp.scale_loss(...)` and what belongs to it."""

    with_node: cst.With
    call: cst.Call
    loss: cst.BaseExpression
    optimizers: List[cst.BaseExpression]
    backward_args: Sequence[cst.Arg]
    function: Scope
    branches: List[Branch]
    steps: List[cst.Call] = field(default_factory=list)


class _Planner:
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.module = ctx.module
        self.builder: Optional[FixBuilder] = None
        self.handled: Set[cst.CSTNode] = set()  # nodes the fix replaces or removes
        self.removal = Removal(self.names)
        self.notes: List[str] = []
        self.unsafe: List[str] = []

    # ------------------------------------------------------------------ entry
    def plan(self) -> AmpPlan:
        usage = amp_usage(self.ctx)
        refs = [r for r in usage.refs if r.api not in APEX_AMP_CAST_ANNOTATIONS]
        plan = AmpPlan()
        for ref in refs:
            if ref.api is None or (ref.via_handle and ref.api == "handle"):
                continue  # presence tests and the handle itself are not findings
            plan.sites.append(Site(ref.node, self._code_for(ref), ref.api))
        if not plan.sites:
            # Imported (maybe tested for) but never used: the import is the finding.
            cast_refs = any(r.api in APEX_AMP_CAST_ANNOTATIONS for r in usage.refs)
            if not usage.import_bindings or cast_refs:
                return plan
            plan.sites.append(Site(usage.import_bindings[0].node, CODE, "import"))
        self.usage = usage
        self.refs = refs
        try:
            plan.fix = self._build(plan)
        except _Unfixable as exc:
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
        inits = [r for r in self.refs if r.api in ("initialize", "init")]
        if not inits:
            if any(r.api not in (None, "disable_casts", "master_params") for r in self.refs):
                raise _Unfixable(
                    "`amp.initialize` is not called in this file: the GradScaler has to be created where it is "
                    "and passed here"
                )
            return self._standalone_fix(plan)
        if len(inits) > 1:
            raise _Unfixable("`amp.initialize` is called more than once in this file")
        init = inits[0]
        if init.call is None:
            raise _Unfixable(f"`{self.ctx.code(init.node)}` is used without being called")
        spec = scaler_spec(self.module, self.names, init.call, self.ctx.quote, handle_api=init.api == "init")
        plan.levels = spec.levels
        if spec.error:
            raise _Unfixable(f"`amp.initialize`: {spec.error}")
        if spec.levels == {"O3"}:
            raise _Unfixable(
                "O3 is pure fp16 training (the model cast to half, no fp32 master weights, no loss scaling); "
                "torch.amp has no such mode, so the choice (fp16 autocast + GradScaler, or bf16) is yours"
            )
        if "O3" in spec.levels and spec.opt_level_code is None:
            raise _Unfixable("`opt_level` may be O3 (pure fp16), which has no torch.amp equivalent")
        fp32 = spec.levels == {"O0"}
        if not fp32 and self.ctx.settings.min_torch < TORCH_AMP_GRAD_SCALER_SINCE:
            raise _Unfixable(
                f"the fix needs `torch.amp.GradScaler` (torch >= {format_version(TORCH_AMP_GRAD_SCALER_SINCE)}); "
                f"min-torch is {format_version(self.ctx.settings.min_torch)}"
            )
        if init.api == "initialize" and spec.optimizers is None and not fp32:
            raise _Unfixable(
                "`amp.initialize` without optimizers is inference: wrap the inference in "
                '`torch.autocast("cuda", dtype=torch.float16)` by hand'
            )
        self.fp32 = fp32
        self.spec = spec
        self.unsafe.extend(spec.unsafe)
        self.notes.extend(spec.notes)
        requires = {s.code for s in plan.sites}
        self.builder = FixBuilder("", SAFE, frozenset(requires))
        self.init = init
        self.init_line = self._init_line(init)
        self.home = self._function_scope(init.call)
        if self.home.kind not in ("function", "module"):
            raise _Unfixable("`amp.initialize` is called in a class body")
        steps = [self._step(r) for r in self.refs if r.api in ("scale_loss", "handle.scale_loss")]
        self._check_other_refs()
        if not steps and not fp32:
            raise _Unfixable(
                "`amp.scale_loss` is not used in this file (the training step is elsewhere): create the "
                '`torch.amp.GradScaler("cuda")` here and pass it to the code that scales the loss'
            )
        if fp32:
            self._plan_fp32(steps)
        else:
            self._plan_fp16(steps)
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        kind = "fp32 (O0)" if fp32 else "torch.autocast fp16 and torch.amp.GradScaler"
        message = f"Migrate apex.amp to {kind}"
        details = self.notes + ([f"unsafe: {'; '.join(self.unsafe)}"] if self.unsafe else [])
        if details:
            message += " (" + "; ".join(details) + ")"
        self.builder.message = message
        self.builder.applicability = UNSAFE if self.unsafe else SAFE
        return self.builder.build()

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
                    raise _Unfixable(
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
            raise _Unfixable("the result of `amp.initialize` is used inside an expression")
        line = self.names.parent(small)
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            raise _Unfixable("`amp.initialize` shares its line with other statements")
        return line

    def _function_scope(self, node: cst.CSTNode) -> Scope:
        scope = self.names.scope_of(node)
        while scope.kind in ("comprehension", "lambda") and scope.parent is not None:
            scope = scope.parent
        return scope

    def _step(self, ref: AmpRef) -> _Step:
        call = ref.call
        if call is None:
            raise _Unfixable(f"`{self.ctx.code(ref.node)}` is used without being called")
        item = self.names.parent(call)
        with_node = self.names.parent(item)
        if not (isinstance(item, cst.WithItem) and isinstance(with_node, cst.With) and len(with_node.items) == 1):
            raise _Unfixable(f"`amp.scale_loss` at line {self._line(call)} is not the only item of a `with` statement")
        if with_node.asynchronous is not None or item.asname is None or not isinstance(item.asname.name, cst.Name):
            raise _Unfixable(f"`with amp.scale_loss(...)` at line {self._line(call)} does not bind the scaled loss to a name")
        scaled = item.asname.name.value
        backward_args = self._backward_args(with_node, scaled)
        if backward_args is None:
            raise _Unfixable(
                f"the body of `with amp.scale_loss(...)` at line {self._line(call)} does more than "
                f"`{scaled}.backward()`"
            )
        params = SCALE_LOSS_PARAMS if not ref.via_handle else ("loss", "optimizers")
        bound = bound_arguments(call, params)
        if bound is None or "loss" not in bound or "optimizers" not in bound:
            raise _Unfixable(f"`amp.scale_loss` at line {self._line(call)} has arguments apex's signature does not match")
        optimizers_node = bound["optimizers"].value
        if isinstance(optimizers_node, (cst.List, cst.Tuple)):
            optimizers = [e.value for e in optimizers_node.elements]
        else:
            optimizers = [optimizers_node]
        for optimizer in optimizers:
            if not isinstance(optimizer, (cst.Name, cst.Attribute)) or not is_pure(optimizer):
                raise _Unfixable(f"the optimizer passed to `amp.scale_loss` at line {self._line(call)} is not a plain name")
        if "delay_unscale" in bound:
            self._note("`delay_unscale` goes: GradScaler keeps gradients scaled until `unscale_`/`step`")
        function = self._function_scope(call)
        return _Step(
            with_node,
            call,
            bound["loss"].value,
            optimizers,
            backward_args,
            function,
            self._branches(with_node, function.node),
        )

    def _backward_args(self, with_node: cst.With, scaled: str) -> Optional[Sequence[cst.Arg]]:
        body = with_node.body
        smalls: List[cst.BaseSmallStatement]
        if isinstance(body, cst.SimpleStatementSuite):
            smalls = list(body.body)
        else:
            if len(body.body) != 1 or not isinstance(body.body[0], cst.SimpleStatementLine):
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

    def _check_other_refs(self) -> None:
        for ref in self.refs:
            if ref.api == "unknown":
                raise _Unfixable(f"`{self.ctx.code(ref.node)}` has no torch.amp counterpart the fix knows")
            if ref.via_handle and ref.api not in ("handle.scale_loss",):
                if ref.api == "handle":
                    raise _Unfixable(f"the amp handle is used as a value at line {self._line(ref.node)}")
                raise _Unfixable(f"`{self.ctx.code(ref.node)}` of the old handle API has no automatic rewrite")

    # ------------------------------------------------------------------ fp16 (O1/O2, amp.init)
    def _plan_fp16(self, steps: List[_Step]) -> None:
        scaler_scopes = [s.function for s in steps]
        for ref in self.refs:
            if ref.api in ("state_dict", "load_state_dict") or (ref.api == "_amp_state"):
                scaler_scopes.append(self._function_scope(ref.node))
        self.access = _ScalerAccess(self, scaler_scopes)
        regions: List[Tuple[Region, _Step]] = []
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
                raise _Unfixable(f"no autocast region for `amp.scale_loss` at line {self._line(step.call)}: {exc}")
            regions.extend((r, step) for r in found)
            self.builder.replace(step.with_node, self._scaled_backward(step))
            self.handled.add(step.with_node)
        self._emit_steps(steps)
        self._plan_regions(regions)
        self._plan_unscale(steps)
        self._plan_simple_refs()
        self._plan_presence_tests()
        self._plan_scaler_creation()
        self.access.emit()

    def _scaled_backward(self, step: _Step) -> cst.SimpleStatementLine:
        scaler = self.access.expression(step.with_node)
        loss_code = self.ctx.code(step.loss).strip()
        args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in step.backward_args)
        line = self.ctx.parse_statement(f"{scaler}.scale({loss_code}).backward({args})\n")
        return line.with_changes(leading_lines=step.with_node.leading_lines)

    # ---- optimizer.step()
    def _plan_step_calls(self, step: _Step, all_steps: List[_Step]) -> None:
        found: List[cst.Call] = []
        for optimizer in step.optimizers:
            wanted = expression_key(optimizer)
            calls: List[cst.Call] = []
            for statement in following(self.names, step.with_node, out_of_loops=True):
                calls = [c for c in self._step_calls(statement) if expression_key(c.func.value) == wanted]
                if calls:
                    break
            if not calls:
                raise _Unfixable(
                    f"no `{self.ctx.code(optimizer).strip()}.step()` follows `amp.scale_loss` at line "
                    f"{self._line(step.call)} in the same function; it must become `scaler.step(...)` + "
                    "`scaler.update()`"
                )
            found.extend(c for c in calls if c not in found)
        step.steps = found

    def _step_calls(self, statement: cst.CSTNode) -> List[cst.Call]:
        return [
            node
            for node in walk(statement)
            if isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            and isinstance(node.func.value, (cst.Name, cst.Attribute))
        ]

    def _emit_steps(self, steps: List[_Step]) -> None:
        calls: Dict[cst.Call, _Step] = {}
        for step in steps:
            for call in step.steps:
                calls.setdefault(call, step)
        # `scaler.update()` once, after the last step of the group in each block.
        by_block: Dict[cst.CSTNode, List[cst.Call]] = {}
        for call in calls:
            line = self._step_line(call)
            by_block.setdefault(containing_block(self.names, line), []).append(call)
        for block, block_calls in by_block.items():
            body = list(body_of(block))
            block_calls.sort(key=lambda c: body.index(self._step_line(c)))
            for call in block_calls:
                self._rewrite_step(call, calls[call], update=call is block_calls[-1])

    def _step_line(self, call: cst.Call) -> cst.SimpleStatementLine:
        expr = self.names.parent(call)
        line = self.names.parent(expr)
        if not (isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            raise _Unfixable(f"`{self.ctx.code(call)}` at line {self._line(call)} is not a statement of its own")
        if call.args:
            raise _Unfixable(f"`{self.ctx.code(call)}` passes a closure, which GradScaler does not support")
        if containing_block(self.names, line) is None:
            raise _Unfixable(f"`{self.ctx.code(call)}` at line {self._line(call)} is on one line with its `if`")
        return line

    def _rewrite_step(self, call: cst.Call, step: _Step, update: bool) -> None:
        line = self._step_line(call)
        scaler = self.access.expression(line)
        optimizer = self.ctx.code(call.func.value).strip()
        lines = [f"{scaler}.step({optimizer})"] + ([f"{scaler}.update()"] if update else [])
        guard = self._needed_guard(step, line)
        if guard is None:
            new = [self.ctx.parse_statement(text + "\n") for text in lines]
        else:
            code = "\n".join(f"    {text}" for text in lines)
            new = [self.ctx.parse_statement(f"if {guard}:\n{code}\nelse:\n    {optimizer}.step()\n")]
        new[0] = new[0].with_changes(leading_lines=line.leading_lines)
        self.builder.replace(line, cst.FlattenSentinel(new))
        self.handled.add(line)

    def _needed_guard(self, step: _Step, node: cst.CSTNode) -> Optional[str]:
        """The condition `node` must test again so that it only goes through the scaler where apex
        was active. Only the `if`s around `amp.scale_loss` that choose between it and a plain
        `loss.backward()` count (an `if` that skips the backward, say on a NaN loss, does not:
        `scaler.step` handles that), and not even those when they are all part of the scaler's
        `enabled` (a disabled scaler passes `step` through to the optimizer)."""
        here = {b.key for b in self._branches(node, step.function.node)}
        missing = [b for b in step.branches if b.key not in here and self._chooses_backward(b)]
        if not missing or {b.key for b in missing} <= self.access.enabled_keys:
            return None
        code = condition_code(self.module, missing)
        if code is None:
            raise _Unfixable(
                f"`amp.scale_loss` at line {self._line(step.call)} runs under a condition with side effects, "
                "which the optimizer step after it would have to test again"
            )
        return code

    def _chooses_backward(self, branch: Branch) -> bool:
        """The other arm of `branch`'s `if` runs a plain backward pass."""
        statement = branch.statement
        other = statement.orelse if branch.taken else statement.body
        if other is None:
            return False
        return any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"
            for n in walk(other)
        )

    def _inactive(self, step: _Step, node: cst.CSTNode) -> bool:
        """True when `node` is in the other branch of an `if` (same test) that `amp.scale_loss` is in:
        the fp32 path of `if fp16: <scaled backward> else: loss.backward()`."""
        here = {b.key for b in self._branches(node, step.function.node)}
        return any((b.key[0], not b.taken) in here for b in step.branches if self._chooses_backward(b))

    # ---- unscale_ before gradient reads
    def _plan_unscale(self, steps: List[_Step]) -> None:
        inserts: Dict[cst.CSTNode, List[Tuple[str, _Step]]] = {}
        order: List[cst.CSTNode] = []
        master_refs = {r.call: r for r in self.refs if r.api == "master_params" and r.call is not None}
        covered_master: Set[cst.Call] = set()
        for step in steps:
            step_lines = {self._step_line(c) for c in step.steps}
            for statement in following(self.names, step.with_node, out_of_loops=True):
                stop = any(any(n is line for n in walk(statement)) for line in step_lines)
                for reader, optimizers in self._gradient_reads(statement, step, master_refs):
                    if stop and not self._before_any(reader, step_lines):
                        continue
                    if reader in master_refs:
                        covered_master.add(reader)
                    elif self._inactive(step, reader):
                        continue
                    point = self._insertion_point(reader, statement)
                    if point not in inserts:
                        inserts[point] = []
                        order.append(point)
                    for optimizer in optimizers:
                        if optimizer not in [o for o, _ in inserts[point]]:
                            inserts[point].append((optimizer, step))
                if stop:
                    break
        for call, ref in master_refs.items():
            if call in covered_master:
                continue
            statement = self.names.statement_of(call)
            if any(self._reads_gradients(n) for n in walk(statement)):
                raise _Unfixable(
                    f"`amp.master_params` at line {self._line(call)} reads gradients outside the backward/step "
                    "window the fix can follow, where `scaler.unscale_` would have to run first"
                )
        order = self._hoist_exclusive(order, inserts)
        done: List[Tuple[cst.CSTNode, str]] = []
        for point in order:
            for optimizer, step in inserts[point]:
                self._check_once_per_step(point, step)
                if any(o == optimizer and self._dominates(p, point) for p, o in done):
                    continue
                done.append((point, optimizer))
                scaler = self.access.expression(point)
                text = f"{scaler}.unscale_({optimizer})"
                guard = self._needed_guard(step, point)
                if guard is not None:
                    text = f"if {guard}:\n    {text}"
                self.builder.insert_before(point, self.ctx.parse_statement(text + "\n"))

    def _hoist_exclusive(self, order: List[cst.CSTNode], inserts) -> List[cst.CSTNode]:
        """`if clip: clip_(...) else: norm(...)`, both reading gradients: one `unscale_` before
        the `if` instead of one in each arm."""
        changed = True
        while changed:
            changed = False
            for point in order:
                arms = self._arm_of(point)
                if arms is None:
                    continue
                statement, arm = arms
                others = [p for p in order if p is not point and self._arm_of(p) == (statement, not arm)]
                same = [p for p in others if {o for o, _ in inserts[p]} == {o for o, _ in inserts[point]}]
                if not same:
                    continue
                inserts[statement] = inserts[point]
                order = [statement if p is point else p for p in order if p is not same[0]]
                changed = True
                break
        return order

    def _arm_of(self, point: cst.CSTNode) -> Optional[Tuple[cst.If, bool]]:
        """(the `if`, True for its body / False for its plain `else`) when `point` is the first
        statement of that arm."""
        block = containing_block(self.names, point)
        body = body_of(block) if block is not None else None
        if not body or body[0] is not point:
            return None
        owner = self.names.parent(block)
        if isinstance(owner, cst.If) and owner.body is block and isinstance(owner.orelse, cst.Else):
            return owner, True
        if isinstance(owner, cst.Else):
            statement = self.names.parent(owner)
            if isinstance(statement, cst.If) and statement.orelse is owner:
                return statement, False
        return None

    def _check_once_per_step(self, point: cst.CSTNode, step: _Step) -> None:
        """`unscale_` may run once per optimizer step: not inside a loop the step is outside of."""
        function = step.function.node
        step_lines = [self._step_line(c) for c in step.steps]
        here = {b.key for b in self._branches(point, function)}
        for line in step_lines:
            extra = [
                b for b in self._branches(line, function)
                if b.key not in here and b.key not in self.access.enabled_keys
            ]
            if extra:
                raise _Unfixable(
                    f"the gradients are read at line {self._line(point)} on every backward pass, but the optimizer "
                    f"steps only `if {self.ctx.code(extra[0].test).strip()}`; apex unscaled every pass, GradScaler "
                    "unscales once per step"
                )
        for loop in loops_between(self.names, point, function):
            if not all(any(a is loop for a in self.names.ancestors(line)) for line in step_lines):
                raise _Unfixable(
                    f"the gradients are read at line {self._line(point)} inside a loop that runs several times "
                    "per optimizer step (with apex each micro-batch was unscaled; GradScaler unscales once)"
                )

    def _gradient_reads(self, statement, step: _Step, master_refs) -> List[Tuple[cst.CSTNode, List[str]]]:
        found = []
        for node in walk(statement):
            if not isinstance(node, cst.Call):
                continue
            if node in master_refs:
                args = node.args
                if len(args) != 1 or args[0].keyword is not None:
                    raise _Unfixable(f"`amp.master_params` at line {self._line(node)} is not called with one optimizer")
                found.append((node, [self.ctx.code(args[0].value).strip()]))
            elif self.names.qualified_names(node.func) & CLIP_GRAD:
                if any(n in master_refs for n in walk(node)):
                    continue  # its master_params argument is the read
                found.append((node, [self.ctx.code(o).strip() for o in step.optimizers]))
        return found

    def _reads_gradients(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Attribute) and node.attr.value == "grad":
            return True
        return isinstance(node, cst.Call) and bool(self.names.qualified_names(node.func) & CLIP_GRAD)

    def _before_any(self, node: cst.CSTNode, lines) -> bool:
        position = self.ctx.position(node).start
        return any((position.line, position.column) < self._start(line) for line in lines)

    def _start(self, node):
        position = self.ctx.position(node).start
        return position.line, position.column

    def _insertion_point(self, reader: cst.CSTNode, top: cst.CSTNode) -> cst.CSTNode:
        loops = loops_between(self.names, reader, top)
        if isinstance(top, (cst.For, cst.While)):
            return top
        if loops:
            return loops[0]
        statement = self.names.statement_of(reader)
        if containing_block(self.names, statement) is None:
            statement = self.names.statement_of(self.names.parent(statement))
        return statement

    def _dominates(self, earlier: cst.CSTNode, later: cst.CSTNode) -> bool:
        """`earlier` always runs before `later`: it precedes `later` or one of its ancestors in a block."""
        block = containing_block(self.names, earlier)
        if block is None:
            return False
        body = list(body_of(block))
        index = body.index(earlier)
        node: Optional[cst.CSTNode] = later
        while node is not None:
            if node in body[index:] and node is not earlier:
                return True
            if node is earlier:
                return True
            node = self.names.parent(node)
        return False

    # ---- autocast regions
    def _plan_regions(self, regions: List[Tuple[Region, _Step]]) -> None:
        merged, problem = merge([r for r, _ in regions])
        if problem:
            raise _Unfixable(problem)
        for region in merged:
            if body_of(region.block) is None:
                raise _Unfixable("the forward pass is on one line with its block header")
            first = region.statements[0]
            torch = self._torch(first)
            dtype = f"{torch}.float16"
            enabled = self.access.autocast_enabled(first)
            args = f'{self.ctx.string("cuda").value}, dtype={dtype}' + (f", enabled={enabled}" if enabled else "")
            header = self.ctx.parse_statement(f"with {torch}.autocast({args}):\n    pass\n")
            assert isinstance(header, cst.With)
            inner = [first.with_changes(leading_lines=())] + list(region.statements[1:])
            with_node = header.with_changes(
                body=header.body.with_changes(body=inner), leading_lines=first.leading_lines
            )
            self.builder.replace(first, with_node)
            for statement in region.statements[1:]:
                self.builder.remove(statement)

    def _model_test(self, function: Scope):
        """A statement runs the model: calls it (`model(x)`, `model.module(x)`, `model.forward(x)`)
        or passes it to a call (`loss = compute_loss(model, batch)`); other methods
        (`model.parse_batch`, `model.zero_grad`) are not the forward pass."""
        keys = self.access.model_keys(function)

        def is_model(node: cst.CSTNode) -> bool:
            if isinstance(node, cst.Name):
                return node.value in keys and node in self.names.loads
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
                return f"self.{node.attr.value}" in keys and bool(self.names.self_attribute_bindings(node))
            return False

        def is_forward_callee(func: cst.CSTNode) -> bool:
            while isinstance(func, cst.Attribute) and func.attr.value in ("module", "forward") and not is_model(func):
                func = func.value
            return is_model(func)

        def uses_model(statement: cst.CSTNode) -> bool:
            if not keys:
                return False
            for node in walk(statement):
                if isinstance(node, cst.Call):
                    if is_forward_callee(node.func) or any(is_model(a.value) for a in node.args):
                        return True
            return False

        return uses_model

    def _forward_like_test(self, function: Scope):
        def looks_like_forward(statement: cst.CSTNode) -> bool:
            for node in walk(statement):
                if not isinstance(node, cst.Call):
                    continue
                func = node.func
                if isinstance(func, cst.Name):
                    bindings = self.names.bindings_of(func)
                    if bindings and all(b.scope is function and b.kind in ("param", "assign", "for", "with") for b in bindings):
                        return True
                if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
                    if self.names.self_attribute_bindings(func):
                        return True
            return False

        return looks_like_forward

    def _is_barrier(self, statement: cst.CSTNode) -> bool:
        for node in walk(statement):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                if node.func.attr.value in ("backward", "step"):
                    return True
            if any(node is r.node for r in self.refs if r.api in ("scale_loss", "handle.scale_loss")):
                return True
        return False

    # ---- master_params, state_dict, load_state_dict, disable_casts, _amp_state
    def _plan_simple_refs(self) -> None:
        for ref in self.refs:
            if ref.api == "master_params":
                self._rewrite_master_params(ref)
            elif ref.api in ("state_dict", "load_state_dict"):
                if ref.call is None:
                    raise _Unfixable(f"`amp.{ref.api}` is used without being called")
                scaler = self.access.expression(ref.call)
                new_func = self.ctx.parse_expression(f"{scaler}.{ref.api}")
                self.builder.replace(ref.node, new_func)
                self.handled.add(ref.node)
                if ref.api == "load_state_dict":
                    self._note("a checkpoint saved by apex (`amp.state_dict()`) does not load into a GradScaler; only new checkpoints do")
            elif ref.api == "disable_casts":
                self._rewrite_disable_casts(ref)
            elif ref.api == "_amp_state":
                self._rewrite_loss_scale_read(ref)

    def _rewrite_master_params(self, ref: AmpRef) -> None:
        call = ref.call
        if call is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            raise _Unfixable(f"`amp.master_params` at line {self._line(ref.node)} is not called with one optimizer")
        optimizer = call.args[0].value
        code = self.ctx.code(optimizer).strip()
        if not isinstance(optimizer, (cst.Name, cst.Attribute)):
            code = f"({code})"
        params = self.ctx.string("params").value
        self.builder.replace(call, self.ctx.parse_expression(f"[p for group in {code}.param_groups for p in group[{params}]]"))
        self.handled.add(call)

    def _rewrite_disable_casts(self, ref: AmpRef) -> None:
        call = ref.call
        item = self.names.parent(call) if call is not None else None
        if call is None or call.args or not isinstance(item, cst.WithItem):
            raise _Unfixable(f"`amp.disable_casts` at line {self._line(ref.node)} is not used as `with amp.disable_casts():`")
        torch = self._torch(call)
        cuda = self.ctx.string("cuda").value
        self.builder.replace(call, self.ctx.parse_expression(f"{torch}.autocast({cuda}, enabled=False)"))
        self.handled.add(call)

    def _rewrite_loss_scale_read(self, ref: AmpRef) -> None:
        """`amp._amp_state.loss_scalers[0].loss_scale()` -> `scaler.get_scale()`."""
        node = ref.node
        chain = []
        current = node
        for _ in range(4):
            parent = self.names.parent(current)
            chain.append(parent)
            current = parent
        scalers, subscript, method, call = chain
        if not (
            isinstance(scalers, cst.Attribute)
            and scalers.attr.value == "loss_scalers"
            and isinstance(subscript, cst.Subscript)
            and isinstance(method, cst.Attribute)
            and method.attr.value == "loss_scale"
            and isinstance(call, cst.Call)
            and not call.args
        ):
            raise _Unfixable(f"`amp._amp_state` at line {self._line(node)} is apex internals the fix cannot map")
        scaler = self.access.expression(call)
        self.builder.replace(call, self.ctx.parse_expression(f"{scaler}.get_scale()"))
        self.handled.add(call)

    # ---- the scaler itself
    def _plan_scaler_creation(self) -> None:
        torch = self._torch(self.init_line)
        keywords = [f"{k}={v}" for k, v in self.spec.keywords]
        enabled = self.access.creation_enabled()
        if enabled:
            keywords.append(f"enabled={enabled}")
        args = ", ".join([self.ctx.string("cuda").value, *keywords])
        creation = f"{self.access.home_expression()} = {torch}.amp.GradScaler({args})"
        self._place_home(creation)

    def _place_home(self, creation: Optional[str]) -> None:
        """Replace the initialize line (keeping any rebinding it did) and create the scaler."""
        rebinding = self._rebinding()
        hoist = self.access.hoist_before if creation else None
        statements: List[str] = []
        if rebinding:
            statements.append(rebinding)
        if creation and hoist is None:
            statements.append(creation)
        if statements:
            new = [self.ctx.parse_statement(s + "\n") for s in statements]
            new[0] = new[0].with_changes(leading_lines=self.init_line.leading_lines)
            self.builder.replace(self.init_line, cst.FlattenSentinel(new))
        else:
            self.removal.remove_statement(self.init_line)
        self.handled.add(self.init_line)
        if hoist is not None:
            self.hoisted = (hoist, self.ctx.parse_statement(creation + "\n"))

    def _rebinding(self) -> Optional[str]:
        """`net, opt = amp.initialize(model, optimizer)` still has to bind `net, opt`."""
        small = self.init_line.body[0]
        if not isinstance(small, cst.Assign) or self.init.api == "init":
            return None  # `handle = amp.init()`: the handle's uses are rewritten instead
        target = small.targets[0].target
        values = [v for v in (self.spec.models, self.spec.optimizers) if v is not None]
        if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(values):
            pairs = list(zip([e.value for e in target.elements], values))
        elif len(values) == 1:
            pairs = [(target, values[0])]
        else:
            raise _Unfixable("the targets of `amp.initialize` do not match its models and optimizers")
        if all(expression_key(t) == expression_key(v) for t, v in pairs):
            return None
        left = ", ".join(self.ctx.code(t).strip() for t, _ in pairs)
        right = ", ".join(self.ctx.code(v).strip() for _, v in pairs)
        return f"{left} = {right}"

    # ------------------------------------------------------------------ fp32 (O0)
    def _plan_fp32(self, steps: List[_Step]) -> None:
        for step in steps:
            loss_code = self.ctx.code(step.loss).strip()
            if not isinstance(step.loss, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                loss_code = f"({loss_code})"
            args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in step.backward_args)
            line = self.ctx.parse_statement(f"{loss_code}.backward({args})\n")
            self.builder.replace(step.with_node, line.with_changes(leading_lines=step.with_node.leading_lines))
            self.handled.add(step.with_node)
        for ref in self.refs:
            if ref.api == "master_params":
                self._rewrite_master_params(ref)
            elif ref.api in ("state_dict", "load_state_dict", "_amp_state"):
                raise _Unfixable(
                    f"`amp.{ref.api}` has no fp32 counterpart; remove it from the checkpoint code by hand"
                )
            elif ref.api == "disable_casts":
                raise _Unfixable("`amp.disable_casts` under O0 has nothing to disable; remove it by hand")
        self._plan_presence_tests()
        self._place_home(None)

    # ------------------------------------------------------------------ presence tests
    def _plan_presence_tests(self) -> None:
        """`amp is None`, `assert amp`, `if args.fp16 and amp is not None:`: apex is gone, torch.amp
        is always there (see _presence). Removals join the removal plan now; other rewrites wait
        until it is known which statements go anyway."""
        refs = self.presence_refs
        self.presence_actions: List[Action] = []
        for ref in self.refs:
            if ref.api is not None:
                continue
            try:
                action = presence_action(self.names, ref.node, refs)
            except Unsupported as exc:
                raise _Unfixable(f"`{self.ctx.code(ref.node)}` at line {self._line(ref.node)} is {exc}")
            if action.kind == "remove":
                self.removal.remove_statement(action.node)
            else:
                self.presence_actions.append(action)
            self.handled.add(action.node)

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
                    raise _Unfixable(f"a test of apex at line {self._line(branch.test)} cannot be folded")
                if isinstance(value, bool):
                    if value != branch.taken:
                        raise _Unfixable(f"code at line {self._line(node)} only runs where apex is missing")
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
            else:
                self.builder.replace(action.node, action.new)

    # ------------------------------------------------------------------ imports
    def _plan_imports(self) -> None:
        handled = set(self.handled)
        for binding in self.usage.import_bindings:
            if unused_after(self.names, binding, handled):
                self.removal.remove_import_binding(binding)
        # Fallback bindings (`amp = None` in the except branch) are removed with their `try`.

    def _emit_removals(self) -> None:
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

    def _check_nesting(self) -> None:
        targets = set(self.builder.targets())
        replaced = {n for n in self.builder.replaced() if not callable(self.builder.replacement(n))}
        for target in targets:
            for ancestor in self.names.ancestors(target):
                if ancestor in replaced:
                    raise _Unfixable(
                        f"two parts of the migration overlap at line {self._line(target)} (the fix would have to "
                        "change a statement it also moves)"
                    )

    # ------------------------------------------------------------------ helpers
    def _torch(self, at: cst.CSTNode) -> str:
        name, needs_import = self.ctx.module_reference(at, "torch")
        if name is None:
            if self.names.has_star_import:
                raise _Unfixable("a star import (`from x import *`) may bind `torch` here; add `import torch` first")
            raise _Unfixable("the name `torch` is taken in this file, so torch.amp cannot be spelled")
        if needs_import:
            self.needs_torch_import = True
        return name

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line


class _ScalerAccess:
    """Where the scaler lives and how each use site spells it (see the module docstring)."""

    def __init__(self, planner: _Planner, use_scopes: List[Scope]) -> None:
        self.p = planner
        self.names = planner.names
        self.home = planner.home
        self.mode = "local"
        self.threaded: List[Scope] = []
        self.hoist_before: Optional[cst.CSTNode] = None
        others = [s for s in dict.fromkeys(use_scopes) if s is not self.home]
        home_class = self.home.parent if self.home.kind == "function" and self.home.parent is not None and self.home.parent.kind == "class" else None
        if others and home_class is not None:
            for scope in others:
                if scope.kind != "function" or scope.parent is not home_class:
                    raise _Unfixable("the scaler would be needed outside the class whose method calls `amp.initialize`")
            self.mode = "attribute"
            self.cls = home_class
        else:
            for scope in others:
                if self._nested_in(scope, self.home) or self.home.kind == "module":
                    continue
                if self._thread(scope, ()):
                    continue
                name = getattr(scope.node, "name", None)
                raise _Unfixable(
                    f"`{name.value if name is not None else '?'}()` uses apex.amp but is not only called (directly) "
                    "from the function that calls `amp.initialize` or from functions it calls, so the scaler "
                    "cannot be passed to it"
                )
        self.name = self._choose_name(use_scopes)
        self._plan_enabled(use_scopes)
        self.model_names = self._models()

    # ---- scopes
    def _nested_in(self, scope: Scope, outer: Scope) -> bool:
        current = scope.parent
        while current is not None:
            if current is outer:
                return True
            current = current.parent
        return False

    def _def_binding(self, scope: Scope) -> Optional[Binding]:
        node = scope.node
        if not isinstance(node, cst.FunctionDef) or scope.parent is None:
            return None
        for binding in scope.parent.bindings.get(node.name.value, []):
            if binding.node is node:
                return binding
        return None

    def _thread(self, scope: Scope, visiting: Tuple[Scope, ...]) -> bool:
        """Pass the scaler to `scope` as a parameter: it must be a module-level function called
        only directly, from the home function or from functions the scaler can be passed to."""
        if scope in self.threaded:
            return True
        if len(visiting) > 3 or scope in visiting:
            return False
        if self.home.kind != "function" or self.home.parent is not self.names.module_scope:
            return False
        if scope.kind != "function" or scope.parent is not self.names.module_scope:
            return False
        binding = self._def_binding(scope)
        if binding is None or len(scope.parent.bindings.get(binding.name, [])) != 1:
            return False
        refs = self.names.references(binding)
        if not refs:
            return False
        callers: List[Scope] = []
        for ref in refs:
            call = self.names.parent(ref)
            if not (isinstance(call, cst.Call) and call.func is ref):
                return False
            callers.append(self.p._function_scope(call))
        for caller in dict.fromkeys(callers):
            if caller is self.home or self._nested_in(caller, self.home):
                continue
            if not self._thread(caller, (*visiting, scope)):
                return False
        self.threaded.append(scope)
        return True

    def _choose_name(self, use_scopes: List[Scope]) -> str:
        if self.mode == "attribute":
            taken = set(self.cls.self_attrs) | set(self.cls.bindings)
            for candidate in SCALER_NAMES:
                if candidate not in taken:
                    return candidate
            raise _Unfixable("every usual name for the scaler is taken on this class")
        scopes = {self.home, *use_scopes, *self.threaded}
        for candidate in SCALER_NAMES:
            if self.home.kind == "module" or self.threaded:
                clash = any(candidate in s.bindings for s in self.names.scopes)
            else:
                clash = any(candidate in s.bindings for s in scopes) or any(
                    candidate == n.value for n in self.names.loads
                )
            if not clash:
                return candidate
        raise _Unfixable("every usual name for the scaler is taken here")

    # ---- spelling
    def _self_name(self, node: cst.CSTNode) -> str:
        scope = self.p._function_scope(node)
        func = scope.node
        if not isinstance(func, cst.FunctionDef) or not func.params.params:
            raise _Unfixable("a method without `self` uses apex.amp")
        return func.params.params[0].name.value

    def expression(self, node: cst.CSTNode) -> str:
        if self.mode == "attribute":
            return f"{self._self_name(node)}.{self.name}"
        return self.name

    def home_expression(self) -> str:
        return self.expression(self.p.init_line)

    # ---- enabled
    def _plan_enabled(self, use_scopes: List[Scope]) -> None:
        """Which `if`s around `amp.initialize` become the scaler's `enabled`, and where it goes."""
        spec = self.p.spec
        init_line = self.p.init_line
        stop = self.home.node
        for ancestor in self.names.ancestors(init_line):
            if ancestor is stop:
                break
            if isinstance(ancestor, (cst.For, cst.While, cst.Try, cst.ExceptHandler, cst.Finally)):
                raise _Unfixable("`amp.initialize` runs inside a loop or a `try`, so where the scaler lives is unclear")
        path = self.p._branches(init_line, stop)
        if self.mode == "attribute" or self.threaded or any(s is not self.home for s in use_scopes):
            common = 0  # other functions may run whether or not the branch did
        else:
            common = len(path)
            for use in self._home_uses():
                use_path = self.p._branches(use, stop)
                shared = 0
                for a, b in zip(path, use_path):
                    if a.statement is b.statement and a.taken == b.taken:
                        shared += 1
                    else:
                        break
                common = min(common, shared)
        conditions = path[common:]
        self.conditions: List[Tuple[str, Tuple[str, bool]]] = []
        for branch in conditions:
            code = condition_code(self.p.module, [branch])
            if code is None:
                raise _Unfixable(
                    f"`amp.initialize` runs under `if {self.p.ctx.code(branch.test).strip()}`, which has side effects, "
                    "so the scaler cannot be created before it"
                )
            self.conditions.append((code, branch.key))
        if conditions:
            self.hoist_before = conditions[0].statement
            while isinstance(self.names.parent(self.hoist_before), cst.If):  # an `elif`
                self.hoist_before = self.names.parent(self.hoist_before)
        for conjunct in spec.enabled:
            if conditions and conjunct.code != "False":
                node = cst.parse_expression(conjunct.code)
                if not is_pure(node):
                    raise _Unfixable("the `enabled` argument of `amp.initialize` has side effects")
            self.conditions.append((conjunct.code, conjunct.key))
        keys = []
        for _, key in self.conditions:
            if key not in keys:
                keys.append(key)
        self.enabled_keys = frozenset(keys)

    def _home_uses(self) -> List[cst.CSTNode]:
        uses: List[cst.CSTNode] = []
        for ref in self.p.refs:
            if ref.api in ("initialize", "init") or ref.api is None:
                continue
            if self.p._function_scope(ref.node) is self.home:
                uses.append(ref.node)
        return uses

    def creation_enabled(self) -> Optional[str]:
        codes: List[str] = []
        seen = set()
        for code, key in self.conditions:
            if key in seen:
                continue
            seen.add(key)
            needs_parens = len(self.conditions) > 1 and " or " in code and not code.startswith("(")
            codes.append(f"({code})" if needs_parens else code)
        return " and ".join(codes) if codes else None

    def autocast_enabled(self, at: cst.CSTNode) -> Optional[str]:
        """autocast is on exactly when apex was: when the scaler is enabled."""
        if not self.conditions:
            return None
        scope = self.p._function_scope(at)
        here = {b.key for b in self.p._branches(at, scope.node)}
        if self.enabled_keys <= here:
            return None
        if scope is self.home and self.mode == "local" and all(is_pure(cst.parse_expression(c)) for c, _ in self.conditions):
            return self.creation_enabled()
        return f"{self.expression(at)}.is_enabled()"

    # ---- models (for the autocast region)
    def _models(self) -> List[str]:
        spec = self.p.spec
        found: List[str] = []

        def add(node: Optional[cst.CSTNode]) -> None:
            if node is None:
                return
            if isinstance(node, (cst.List, cst.Tuple)):
                for element in node.elements:
                    add(element.value)
            elif isinstance(node, cst.Name):
                found.append(node.value)
            elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
                found.append(f"self.{node.attr.value}")
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                add(node.func.value)  # amp.initialize(model.cuda(), ...)

        add(spec.models)
        small = self.p.init_line.body[0]
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                add(target.elements[0].value)
            elif spec.optimizers is None:
                add(target)
        return found

    def model_keys(self, function: Scope, depth: int = 0) -> Set[str]:
        """Names (or `self.x`) that hold the model in `function`: the initialized models at home,
        and in a function the scaler is passed to, the parameters its callers pass them as."""
        if function is self.home or self._nested_in(function, self.home) or self.home.kind == "module":
            return set(self.model_names)
        if self.mode == "attribute":
            return {n for n in self.model_names if n.startswith("self.")}
        keys: Set[str] = set()
        if function in self.threaded and depth < 4:
            binding = self._def_binding(function)
            params = function.node.params
            positional = [p.name.value for p in (*params.posonly_params, *params.params)]
            for ref in self.names.references(binding):
                call = self.names.parent(ref)
                caller_keys = self.model_keys(self.p._function_scope(call), depth + 1)
                position = 0
                for arg in call.args:
                    if arg.star:
                        break
                    if arg.keyword is not None:
                        name = arg.keyword.value
                    else:
                        name = positional[position] if position < len(positional) else None
                        position += 1
                    value = arg.value
                    if name and isinstance(value, cst.Name) and value.value in caller_keys:
                        keys.add(name)
        return keys

    # ---- edits for threading
    def emit(self) -> None:
        builder = self.p.builder
        for scope in self.threaded:
            func = scope.node
            builder.replace(func.params, add_parameter(func.params, self.name))
            binding = self._def_binding(scope)
            for ref in self.names.references(binding):
                call = self.names.parent(ref)
                arg = cst.Arg(
                    cst.Name(self.name),
                    keyword=cst.Name(self.name),
                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
                )
                builder.replace(call, rebuild_args(call, [*call.args, arg]))
                self.p.handled.add(call)
        if self.threaded:
            self.p._note(
                "the scaler is passed to "
                + ", ".join(f"`{s.node.name.value}()`" for s in self.threaded)
                + " as a new `scaler` argument"
            )


def add_parameter(params: cst.Parameters, name: str) -> cst.Parameters:
    """`params` with a parameter `name` added last (keyword-only when a default or `*` precedes)."""
    new_param = cst.Param(cst.Name(name))
    simple = (
        not any(p.default is not None for p in params.params)
        and isinstance(params.star_arg, cst.MaybeSentinel)
        and not params.kwonly_params
        and params.star_kwarg is None
    )
    if simple:
        existing = list(params.params)
        if not existing:
            return params.with_changes(params=[new_param])
        last = existing[-1]
        if isinstance(last.comma, cst.Comma):
            separator = existing[-2].comma if len(existing) > 1 and isinstance(existing[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            existing[-1] = last.with_changes(comma=separator)
            new_param = new_param.with_changes(comma=last.comma)
        else:
            existing[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return params.with_changes(params=existing + [new_param])
    kwonly = list(params.kwonly_params)
    star_arg = params.star_arg
    if isinstance(star_arg, cst.MaybeSentinel):
        star_arg = cst.ParamStar(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        # the parameter before `*` needs a comma
        before = list(params.params)
        if before and not isinstance(before[-1].comma, cst.Comma):
            before[-1] = before[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        params = params.with_changes(params=before)
    elif isinstance(star_arg, cst.Param) and not isinstance(star_arg.comma, cst.Comma):
        star_arg = star_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    if kwonly and not isinstance(kwonly[-1].comma, cst.Comma):
        kwonly[-1] = kwonly[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    if params.star_kwarg is not None:
        new_param = new_param.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return params.with_changes(star_arg=star_arg, kwonly_params=kwonly + [new_param])
