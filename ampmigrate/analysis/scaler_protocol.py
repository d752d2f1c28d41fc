"""The GradScaler protocol along the paths of each function: what runs before what.

For every function (and the module body) that uses a scaler, the code is read as a sequence of
protocol events, in execution order:

    scaled_backward  `scaler.scale(loss).backward()`          backward   any other `.backward()`
    unscale          `scaler.unscale_(opt)`                   step       `scaler.step(opt)`
    update           `scaler.update()`                        plain_step `opt.step()`
    clip             a gradient clip or a read of `.grad`'s magnitude (also inside a helper
                     function of this file that receives the parameters or the optimizer)
    opaque           a call that may use the scaler where we cannot follow (the scaler passed to
                     a function, `self.<method>()` of a trainer that keeps `self.scaler`)

and `flow.FlowWalker` carries `Facts` (what may or must have happened since the last `update()`)
along every path, including around loop back edges, so that one iteration of an accumulation
loop sees what the previous one left behind. Rules read the resulting observations:

- clips that ran after a scaled backward and before `scaler.step(opt)` with no `unscale_(opt)`
  in between, on some path (`clip_findings`);
- `unscale_(opt)` reached again with no `update()` since it last ran (`repeat_unscales`), or
  reached when another `unscale_(opt)` ran on every path since the last update (`double_unscales`);
- `update()` on a path that neither stepped nor unscaled since the last update
  (`updates_without_step`), `scaler.step(opt)` reached again before any update (`repeat_steps`);
- `opt.step()` where on every path the last backward was a scaled one (`plain_steps`).

Anything after an opaque call is unknown until the next `update()`, and the rules stay silent.
A finding that needs "the step was skipped this iteration" is kept only when, under the same
values of the function's stable flags, the step is reachable at all (otherwise the flags
themselves cannot hold together, as in `if args.amp: ...unscale_...` / `if scaler: ...step...`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.analysis import flow
from ampmigrate.analysis.scalers import Scaler, callee_definitions, escapes, family, local_bases, protocol_scalers
from ampmigrate.api import (
    CLIP_GRAD,
    CLIP_GRAD_METHODS,
    GRAD_MAGNITUDE_METHODS,
    LIGHTNING_MODULE,
    NORM_FUNCTIONS,
    NOT_OPTIMIZER_MODULES,
    OPTIMIZER_CLASSES,
    OPTIMIZER_MODULES,
    SELF_UNSCALING,
)
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.cst_walk import walk
from ampmigrate.engine.names import NameIndex

SCALED_BACKWARD = "scaled_backward"
BACKWARD = "backward"
UNSCALE = "unscale"
STEP = "step"
UPDATE = "update"
PLAIN_STEP = "plain_step"
ZERO_GRAD = "zero_grad"
CLIP = "clip"
OPAQUE = "opaque"

_GRAD_PASSTHROUGH = frozenset({"data", "detach", "float", "double", "clone", "to", "cpu", "view", "flatten", "reshape"})
_HELPER_DEPTH = 3
# Base classes whose methods never touch a user's scaler (`nn.Module.parameters()`, ABC, ...).
_KNOWN_BASE_MODULES = ("torch.", "abc.", "typing.", "dataclasses.")


# ---------------------------------------------------------------------------------- optimizers
@dataclass(frozen=True)
class OptimizerKey:
    """Which optimizer an expression denotes, as far as a static reading can tell.

    `stable` is False for a loop variable or `opts[i]`: one expression, a different optimizer
    on each iteration, so "the same optimizer again" cannot be concluded from it.
    """

    key: Tuple
    stable: bool


def optimizer_key(names: NameIndex, expr: cst.BaseExpression) -> OptimizerKey:
    if isinstance(expr, cst.Name):
        bindings = names.bindings_of(expr)
        if not bindings:
            return OptimizerKey(("free", expr.value), True)
        stable = not any(b.kind in ("for", "with", "walrus") for b in bindings)
        return OptimizerKey(("name", tuple(id(b) for b in bindings)), stable)
    if isinstance(expr, cst.Attribute):
        if isinstance(expr.value, cst.Name):
            class_scope = names.method_class_scope(expr.value)
            if class_scope is not None:
                return OptimizerKey(("attr", id(class_scope), expr.attr.value), True)
        root = optimizer_key(names, expr.value)
        return OptimizerKey(root.key + ("." + expr.attr.value,), root.stable)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        index = expr.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, (cst.Integer, cst.SimpleString)):
            root = optimizer_key(names, expr.value)
            return OptimizerKey(root.key + ("[" + index.value.value + "]",), root.stable)
    return OptimizerKey(("expr", id(expr)), False)


def is_optimizer_class(qname: str) -> bool:
    if qname in OPTIMIZER_CLASSES:
        return True
    return qname.startswith(OPTIMIZER_MODULES) and not qname.startswith(NOT_OPTIMIZER_MODULES)


# ---------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Event:
    kind: str
    node: cst.CSTNode  # the call
    optimizer: Optional[OptimizerKey] = None
    optimizer_expr: Optional[cst.BaseExpression] = None
    detail: str = ""  # clip: "clip" | "read"; opaque: why
    receiver: Optional[cst.BaseExpression] = None  # how the scaler is named here (`scaler`, `self.scaler`)
    scaled: Optional[cst.BaseExpression] = None  # scaled_backward: what was scaled (`loss` in `scaler.scale(loss)`)
    elsewhere: str = ""  # clip: the other file of the run defining the helper called here


@dataclass(frozen=True)
class Facts:
    """What may (or must) have happened since the last `update()` on the paths merged here."""

    unknown: bool = False  # an opaque call ran since the last update: history not known
    scaled: bool = False  # may: a scaled backward ran since the last update
    last_scaled: bool = False  # may: the latest backward was a scaled one
    last_plain: bool = False  # may: the latest backward was a plain one (or none is known)
    unscaled: FrozenSet[Tuple[OptimizerKey, cst.CSTNode]] = frozenset()  # may: (optimizer, unscale_ call)
    must_unscaled: FrozenSet[OptimizerKey] = frozenset()
    stepped: FrozenSet[Tuple[OptimizerKey, cst.CSTNode]] = frozenset()  # may: (optimizer, step call)
    idle: bool = True  # may: a path since the last update with neither a step nor an unscale_
    # may: clips that ran after a scaled backward (and since the latest backward), each with the
    # optimizers that may have been unscaled before it.
    pending: FrozenSet[Tuple[cst.CSTNode, FrozenSet[OptimizerKey]]] = frozenset()
    # Across updates (the gradients in memory do not care about them):
    live: bool = False  # may: a scaled backward ran since the last step / zero_grad
    unstepped: FrozenSet[Tuple[OptimizerKey, cst.CSTNode]] = frozenset()  # may: unscale_ not yet followed by step / zero_grad
    stale_updates: FrozenSet[cst.CSTNode] = frozenset()  # may: updates that ran while gradients were live, unstepped

    def join(self, other: "Facts") -> "Facts":
        if self == other:
            return self
        return Facts(
            unknown=self.unknown or other.unknown,
            scaled=self.scaled or other.scaled,
            last_scaled=self.last_scaled or other.last_scaled,
            last_plain=self.last_plain or other.last_plain,
            unscaled=self.unscaled | other.unscaled,
            must_unscaled=self.must_unscaled & other.must_unscaled,
            stepped=self.stepped | other.stepped,
            idle=self.idle or other.idle,
            pending=self.pending | other.pending,
            live=self.live or other.live,
            unstepped=self.unstepped | other.unstepped,
            stale_updates=self.stale_updates | other.stale_updates,
        )

    @property
    def unscaled_optimizers(self) -> FrozenSet[OptimizerKey]:
        return frozenset(key for key, _ in self.unscaled)

    @property
    def stepped_optimizers(self) -> FrozenSet[OptimizerKey]:
        return frozenset(key for key, _ in self.stepped)


FRESH = Facts(last_plain=True)
AFTER_SCALED_BACKWARD = Facts(scaled=True, last_scaled=True)
UNKNOWN = Facts(unknown=True, last_plain=True)


# ---------------------------------------------------------------------------------- observations
@dataclass
class ClipFinding:
    clip: cst.Call  # the clip (or read, or helper) call
    kind: str  # "clip" | "read"
    detail: str  # what is called, for the message
    elsewhere: str = ""  # the other file defining the helper called, if it is one
    steps: List[Event] = field(default_factory=list)  # the scaler.step events it precedes, in order

    def optimizers(self) -> List[Event]:
        seen: Set[OptimizerKey] = set()
        out: List[Event] = []
        for step in self.steps:
            if step.optimizer not in seen:
                seen.add(step.optimizer)
                out.append(step)
        return out


@dataclass
class UnitAnalysis:
    """The protocol analysis of one function (or the module body) for one scaler family."""

    owner: cst.CSTNode  # FunctionDef or Module
    body: Sequence[cst.BaseStatement]
    scalers: List[Scaler]
    entry: str  # "fresh" | "scaled" | "unknown"
    events: "EventReader"
    clip_findings: Dict[cst.CSTNode, ClipFinding] = field(default_factory=dict)
    # Every clip (found or not): the optimizers that some path may have unscaled before it ...
    clip_unscaled: Dict[cst.CSTNode, Set[OptimizerKey]] = field(default_factory=dict)
    # ... clips reached while another clip of the same step was pending, or after an opaque call.
    clip_after_other_clip: Set[cst.CSTNode] = field(default_factory=set)
    clip_unknown: Set[cst.CSTNode] = field(default_factory=set)
    repeat_unscales: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    # unscale_ calls whose (now unscaled) gradients receive another scaled backward before a step
    unscales_before_accumulation: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    # updates that changed the scale while gradients were accumulating (another scaled backward followed)
    updates_during_accumulation: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    double_unscales: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    updates_without_step: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    repeat_steps: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    plain_steps: Dict[cst.CSTNode, Event] = field(default_factory=dict)
    plain_steps_mixed: Set[cst.CSTNode] = field(default_factory=set)  # also reached after a plain backward
    complete: bool = True  # False when the walk gave up (too many paths)


def analyses(ctx: FileContext) -> List[UnitAnalysis]:
    """Every (function, scaler family) pair of the file, analysed (computed once per file)."""
    return ctx.shared("scaler_protocol", lambda: _Analyzer(ctx).run())


# ---------------------------------------------------------------------------------- event reading
class EventReader:
    """Protocol events of any unit of code inside one function, for one scaler family."""

    def __init__(self, analyzer: "_Analyzer", owner: cst.CSTNode, scalers: List[Scaler]) -> None:
        self.analyzer = analyzer
        self.names = analyzer.names
        self.owner = owner
        self.scalers = scalers
        self.uses = {use.call: use for s in scalers for use in s.uses}
        self.refs = {id(ref) for s in scalers for ref in s.other_refs}
        self._cache: Dict[cst.CSTNode, List[Event]] = {}
        self._all: Optional[List[Event]] = None
        self._ancestors: Dict[int, Set[int]] = {}

    def all_events(self) -> List[Event]:
        """Every event of the function, in evaluation order (one pass over its body)."""
        if self._all is None:
            collector = _EventCollector(self)
            walk(self.owner.body if isinstance(self.owner, cst.FunctionDef) else self.owner, collector)
            self._all = collector.events
        return self._all

    def of(self, unit: cst.CSTNode) -> List[Event]:
        """The events inside `unit` (a statement, an expression), in evaluation order."""
        cached = self._cache.get(unit)
        if cached is None:
            key = id(unit)
            cached = self._cache[unit] = [e for e in self.all_events() if e.node is unit or key in self._above(e.node)]
        return cached

    def _above(self, node: cst.CSTNode) -> Set[int]:
        found = self._ancestors.get(id(node))
        if found is None:
            found = set()
            for ancestor in self.names.ancestors(node):
                found.add(id(ancestor))
                if ancestor is self.owner:
                    break
            self._ancestors[id(node)] = found
        return found

    # ------------------------------------------------------------------ one call
    def classify(self, call: cst.Call) -> Optional[Event]:
        names = self.names
        use = self.uses.get(call)
        if use is not None:
            if use.method in ("unscale_", "step"):
                expr = optimizer_argument(call)
                if expr is None:
                    return Event(OPAQUE, call, detail="call without an optimizer argument")
                kind = UNSCALE if use.method == "unscale_" else STEP
                return Event(kind, call, optimizer_key(names, expr), expr, receiver=use.receiver)
            if use.method == "update":
                return Event(UPDATE, call, receiver=use.receiver)
            return None
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            scale = self._scale_use(func.value)
            if scale is not None:
                return Event(SCALED_BACKWARD, call, receiver=scale.receiver, scaled=_first_argument(scale.call))
            return Event(BACKWARD, call)
        qnames = names.qualified_names(func)
        if "torch.autograd.backward" in qnames:
            scale = self._scale_use(call.args[0].value) if call.args else None
            if scale is not None:
                return Event(SCALED_BACKWARD, call, receiver=scale.receiver, scaled=_first_argument(scale.call))
            return Event(BACKWARD, call)
        if any(id(arg.value) in self.refs for arg in call.args):
            return Event(OPAQUE, call, detail="the scaler is passed to a call")
        if qnames & CLIP_GRAD:
            if self._threshold_scaled(call):
                return None  # `max_norm * scaler.get_scale()`: clips the scaled gradients on purpose
            return Event(CLIP, call, detail=self.analyzer.code(func))
        if qnames & NORM_FUNCTIONS and call.args and self.analyzer.holds_grads(call.args[0].value):
            return Event(CLIP, call, detail="read:" + self.analyzer.code(func))
        if isinstance(func, cst.Attribute) and not qnames:
            method = func.attr.value
            if method in CLIP_GRAD_METHODS and not self.analyzer.self_unscaling(func.value):
                return Event(CLIP, call, detail=f"{self.analyzer.code(func.value)}.{method}")
            if method in GRAD_MAGNITUDE_METHODS and self.analyzer.is_grad(func.value):
                return Event(CLIP, call, detail=f"read:{self.analyzer.code(func)}")
            if method == "zero_grad":
                return Event(ZERO_GRAD, call)
            if method == "step" and self.analyzer.is_optimizer(func.value, self.owner):
                return Event(PLAIN_STEP, call, optimizer_key(names, func.value), func.value)
        if self._value_divided_by_scale(call):
            return None  # `get_grad_norm(params) / scaler.get_scale()`: reads the scaled gradients on purpose
        helper = self.analyzer.helper_effect(call, self.scalers)
        if helper is not None:
            return helper
        return None

    def _value_divided_by_scale(self, call: cst.Call) -> bool:
        """`f(...) / scaler.get_scale()` with this scaler: the form the apex migration writes for a
        gradient-norm helper on every micro-step of gradient accumulation (a p-norm scales with
        the gradients, rules/apex/_accumulation_clip.py)."""
        parent = self.names.parent(call)
        if not (isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and parent.left is call):
            return False
        right = parent.right
        use = self.uses.get(right) if isinstance(right, cst.Call) else None
        return use is not None and use.method == "get_scale"

    def _threshold_scaled(self, call: cst.Call) -> bool:
        """A clip whose threshold is multiplied by this scaler's `get_scale()`: the form the apex
        migration writes for a clip on every micro-step of gradient accumulation (exact, since
        clipping is homogeneous and the scale is constant until `update()`)."""
        for arg in call.args[1:]:
            value = arg.value
            if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
                for side in (value.left, value.right):
                    use = self.uses.get(side) if isinstance(side, cst.Call) else None
                    if use is not None and use.method == "get_scale":
                        return True
        return False

    def _scale_use(self, tensor: cst.BaseExpression):
        """The `scaler.scale(x)` use that `tensor` is (or a name only ever assigned from one)."""
        if isinstance(tensor, cst.Call):
            use = self.uses.get(tensor)
            return use if use is not None and use.method == "scale" else None
        if isinstance(tensor, cst.Name):
            bindings = self.names.bindings_of(tensor)
            found = [
                self._scale_use(b.value) if b.kind == "assign" and isinstance(b.value, cst.Call) else None
                for b in bindings
            ]
            if found and all(found):
                return found[0]
        return None


def optimizer_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The optimizer of `scaler.step(opt)` / `scaler.unscale_(optimizer=opt)`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "optimizer":
            return arg.value
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return None


def _first_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    return call.args[0].value if call.args and call.args[0].keyword is None and not call.args[0].star else None


class _EventCollector(cst.CSTVisitor):
    """Calls of a node in evaluation order (post-order), not entering nested scopes.

    Flow units (small statements, `if` tests, ...) hold no blocks; asked about a compound
    statement, the collector gives every event in it (used to tell relevant branches).
    """

    def __init__(self, reader: EventReader) -> None:
        super().__init__()
        self.reader = reader
        self.events: List[Event] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Call(self, original_node: cst.Call) -> None:
        event = self.reader.classify(original_node)
        if event is not None:
            self.events.append(event)


# ---------------------------------------------------------------------------------- the client
class _ProtocolClient(flow.FlowClient):
    def __init__(self, unit: UnitAnalysis, conditions: flow.Conditions) -> None:
        self.unit = unit
        self.stable = conditions.stable_keys()
        # Scenarios (values of stable flags) in which a scaler.step ran: see the module docstring.
        self.step_scenarios: List[flow.Assignment] = []
        self.pending_scenario: List[Tuple[Dict, cst.CSTNode, Event, flow.Assignment]] = []
        # Optimizers the scaler steps somewhere: `opt.step()` on another path is deliberate.
        self.analyzer_scaler_steps = {
            optimizer_key(unit.events.names, optimizer_argument(use.call)).key
            for scaler in unit.scalers
            for use in scaler.uses
            if use.method == "step" and optimizer_argument(use.call) is not None
        }

    def join(self, a: Facts, b: Facts) -> Facts:
        return a.join(b)

    def transfer(self, facts: Facts, node: cst.CSTNode, assignment: flow.Assignment, record: bool) -> Facts:
        for event in self.unit.events.of(node):
            facts = self._event(facts, event, assignment, record)
        return facts

    def _scenario(self, assignment: flow.Assignment) -> flow.Assignment:
        return frozenset(item for item in assignment if item[0] in self.stable)

    def _event(self, facts: Facts, event: Event, assignment: flow.Assignment, record: bool) -> Facts:
        unit = self.unit
        kind = event.kind
        if kind == SCALED_BACKWARD:
            if record and not facts.unknown:
                scenario = self._scenario(assignment)
                for _, unscale in facts.unstepped:
                    self.pending_scenario.append((unit.unscales_before_accumulation, unscale, event, scenario))
                for update in facts.stale_updates:
                    self.pending_scenario.append((unit.updates_during_accumulation, update, event, scenario))
            return replace(facts, scaled=True, last_scaled=True, last_plain=False, pending=frozenset(), live=True)
        if kind == ZERO_GRAD:
            return replace(facts, live=False, unstepped=frozenset(), stale_updates=frozenset())
        if kind == BACKWARD:
            return replace(facts, last_scaled=False, last_plain=True, pending=frozenset())
        if kind == OPAQUE:
            return replace(facts, unknown=True, pending=frozenset())
        if kind == CLIP:
            if record:
                if facts.unknown:
                    unit.clip_unknown.add(event.node)
                unit.clip_unscaled.setdefault(event.node, set()).update(facts.unscaled_optimizers)
                if any(clip is not event.node for clip, _ in facts.pending):
                    unit.clip_after_other_clip.add(event.node)
            if facts.unknown or not facts.scaled:
                return facts
            return replace(facts, pending=facts.pending | {(event.node, facts.unscaled_optimizers)})
        if kind == UNSCALE:
            opt = event.optimizer
            if record and not facts.unknown and opt.stable:
                if (opt, event.node) in facts.unscaled:
                    self.pending_scenario.append((unit.repeat_unscales, event.node, event, self._scenario(assignment)))
                elif opt in facts.must_unscaled:
                    unit.double_unscales[event.node] = event
            return replace(
                facts,
                unscaled=facts.unscaled | {(opt, event.node)},
                must_unscaled=facts.must_unscaled | {opt},
                unstepped=facts.unstepped | ({(opt, event.node)} if opt.stable else frozenset()),
                idle=False,
            )
        if kind == STEP:
            opt = event.optimizer
            if record and not facts.unknown:
                self.step_scenarios.append(self._scenario(assignment))
                for clip, unscaled in facts.pending:
                    if opt not in unscaled and not any(not key.stable for key in unscaled):
                        finding = unit.clip_findings.get(clip)
                        if finding is None:
                            kind_, detail = _clip_kind(unit, clip)
                            finding = unit.clip_findings[clip] = ClipFinding(clip, kind_, detail, _elsewhere(unit, clip))
                        if event not in finding.steps:
                            finding.steps.append(event)
                if opt.stable and (opt, event.node) in facts.stepped:
                    unit.repeat_steps[event.node] = event
            return replace(
                facts,
                stepped=facts.stepped | {(opt, event.node)},
                idle=False,
                live=False,
                unstepped=frozenset(item for item in facts.unstepped if item[0] != opt and opt.stable),
                stale_updates=frozenset(),
            )
        if kind == UPDATE:
            if record and not facts.unknown and facts.scaled and facts.idle:
                self.pending_scenario.append((unit.updates_without_step, event.node, event, self._scenario(assignment)))
            stale = facts.stale_updates | ({event.node} if facts.live else frozenset())
            return Facts(
                last_scaled=facts.last_scaled,
                last_plain=facts.last_plain,
                live=facts.live,
                unstepped=facts.unstepped,
                stale_updates=stale,
            )
        if kind == PLAIN_STEP:
            if (
                record
                and event.optimizer.key not in self.analyzer_scaler_steps
                and not facts.unknown
                and facts.last_scaled
                and not facts.last_plain
                and event.optimizer not in facts.unscaled_optimizers
            ):
                unit.plain_steps[event.node] = event
            if record and (facts.unknown or facts.last_plain):
                unit.plain_steps_mixed.add(event.node)
            return facts
        return facts

    def finish(self) -> None:
        """Keep "skipped step" observations only in scenarios where a step can run at all, and
        clips only where no path unscaled that optimizer before them: code that unscales on one
        path (`if amp: scaler.unscale_(opt)`) knows the protocol, and its other paths usually
        run with the scaler disabled."""
        for target, node, event, scenario in self.pending_scenario:
            if any(_compatible(scenario, other) for other in self.step_scenarios):
                target[node] = event
        unit = self.unit
        for clip, finding in list(unit.clip_findings.items()):
            unscaled = unit.clip_unscaled.get(clip, set())
            finding.steps = [step for step in finding.steps if step.optimizer not in unscaled]
            if not finding.steps:
                del unit.clip_findings[clip]


def _compatible(a: flow.Assignment, b: flow.Assignment) -> bool:
    values = dict(a)
    return all(values.get(key, value) == value for key, value in b)


def _elsewhere(unit: UnitAnalysis, clip: cst.CSTNode) -> str:
    return next((e.elsewhere for e in unit.events.of(clip) if e.node is clip and e.kind == CLIP), "")


def _clip_kind(unit: UnitAnalysis, clip: cst.CSTNode) -> Tuple[str, str]:
    for event in unit.events.of(clip):
        if event.node is clip and event.kind == CLIP:
            if event.detail.startswith("read:"):
                return "read", event.detail[len("read:") :]
            return "clip", event.detail
    return "clip", ""


# ---------------------------------------------------------------------------------- the analyzer
@dataclass
class _Summary:
    grads: Optional[str] = None  # "clip" | "read": the function clips or reads gradient magnitudes
    scalers: Set[int] = field(default_factory=set)  # ids of scalers it uses (directly or not)
    protocol: bool = False  # calls `.unscale_` on something, or is too deep (or recursive) to tell


class _Analyzer:
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.module = ctx.module
        self.scalers = [s for s in protocol_scalers(ctx) if not s.disabled]
        self._owners: Dict[int, cst.CSTNode] = {}
        self._summaries: Dict[int, _Summary] = {}
        self._in_progress: Set[int] = set()
        self._grad_memo: Dict[int, bool] = {}
        self._opt_receivers: Optional[Dict[cst.CSTNode, Set[Tuple]]] = None
        self.imports_accelerate = any(
            (b.qname or "").split(".")[0] == "accelerate"
            for scope in self.names.scopes
            for bindings in scope.bindings.values()
            for b in bindings
        )

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # ------------------------------------------------------------------ structure
    def owner_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The function whose body runs `node` (the module for top-level code)."""
        cached = self._owners.get(id(node))
        if cached is not None:
            return cached
        owner: cst.CSTNode = self.module
        for ancestor in self.names.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                owner = ancestor
                break
        self._owners[id(node)] = owner
        return owner

    def _in_lightning_module(self, func: cst.CSTNode) -> bool:
        parent = self.names.enclosing(func, (cst.ClassDef, cst.FunctionDef))
        if not isinstance(parent, cst.ClassDef):
            return False
        return any(self.names.qualified_names(base.value) & LIGHTNING_MODULE for base in parent.bases)

    def run(self) -> List[UnitAnalysis]:
        units: List[UnitAnalysis] = []
        groups: List[List[Scaler]] = []
        for scaler in self.scalers:
            if not any(scaler in group for group in groups):
                groups.append([s for s in family(scaler) if s in self.scalers])
        for group in groups:
            owners: List[cst.CSTNode] = []
            for scaler in group:
                for use in scaler.uses:
                    owner = self.owner_of(use.call)
                    if owner not in owners:
                        owners.append(owner)
            for owner in owners:
                if isinstance(owner, cst.FunctionDef) and self._in_lightning_module(owner):
                    continue
                units.append(self._analyse(owner, group))
        return units

    def _entry(self, reader: EventReader, group: List[Scaler]) -> str:
        if any(e.kind == SCALED_BACKWARD for e in reader.all_events()):
            return "fresh"
        if any(s.calls("unscale_") for s in group) or not any(s.calls("scale") for s in group):
            return "unknown"
        if any(escapes(self.names, s) for s in group):
            return "unknown"
        # Nothing ever unscales this scaler and it does scale losses: gradients it steps are scaled.
        return "scaled"

    def _analyse(self, owner: cst.CSTNode, group: List[Scaler]) -> UnitAnalysis:
        reader = EventReader(self, owner, group)
        body = owner.body.body if isinstance(owner, cst.FunctionDef) else owner.body
        if isinstance(owner, cst.FunctionDef) and not isinstance(owner.body, cst.IndentedBlock):
            body = [owner.body]
        unit = UnitAnalysis(owner, body, group, "fresh", reader)
        unit.entry = self._entry(reader, group)
        if unit.entry == "unknown" and not any(e.kind in (STEP, UPDATE, UNSCALE) for e in reader.all_events()):
            return unit

        def relevant(statement: cst.CSTNode) -> bool:
            return any(event.kind != CLIP for event in reader.of(statement))

        conditions = flow.Conditions(self.module, body, relevant)
        client = _ProtocolClient(unit, conditions)
        entry = {"fresh": FRESH, "scaled": AFTER_SCALED_BACKWARD, "unknown": UNKNOWN}[unit.entry]
        try:
            flow.FlowWalker(body, client, conditions).run(entry)
        except flow.TooComplex:
            unit.complete = False
            unit.clip_findings.clear()
            return unit
        client.finish()
        return unit

    # ------------------------------------------------------------------ gradients
    def is_grad(self, expr: cst.BaseExpression) -> bool:
        """`p.grad`, `p.grad.data`, `p.grad.detach().float()`, ...: a gradient tensor."""
        memo = self._grad_memo.get(id(expr))
        if memo is not None:
            return memo
        result = False
        if isinstance(expr, cst.Attribute):
            if expr.attr.value == "grad":
                result = not self.names.qualified_names(expr)  # not `torch.autograd.grad`
            elif expr.attr.value in _GRAD_PASSTHROUGH:
                result = self.is_grad(expr.value)
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            if expr.func.attr.value in _GRAD_PASSTHROUGH:
                result = self.is_grad(expr.func.value)
        self._grad_memo[id(expr)] = result
        return result

    def holds_grads(self, expr: cst.BaseExpression) -> bool:
        """A gradient, or a list/generator of them (`[p.grad for p in params]`)."""
        if self.is_grad(expr):
            return True
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
            return self.is_grad(expr.elt)
        if isinstance(expr, (cst.List, cst.Tuple)):
            return bool(expr.elements) and all(self.is_grad(e.value) for e in expr.elements)
        return False

    def self_unscaling(self, receiver: cst.BaseExpression) -> bool:
        """Accelerate's `accelerator.clip_grad_norm_` unscales with its own scaler first."""
        if self.names.instance_classes(receiver) & SELF_UNSCALING:
            return True
        # An object we cannot resolve, in a file that uses Accelerate: assume it is the accelerator.
        return self.imports_accelerate and not self.names.instance_classes(receiver)

    # ------------------------------------------------------------------ optimizers
    def is_optimizer(self, expr: cst.BaseExpression, owner: cst.CSTNode) -> bool:
        if any(is_optimizer_class(q) for q in self.names.instance_classes(expr)):
            return True
        key = optimizer_key(self.names, expr)
        return key.stable and key.key in self._optimizer_keys(owner)

    def _optimizer_keys(self, owner: cst.CSTNode) -> Set[Tuple]:
        """Keys of objects used like optimizers in `owner`: `x.zero_grad()` and `x.step()` both called,
        or passed to a scaler's step/unscale_ anywhere in the file."""
        if self._opt_receivers is None:
            zero: Dict[cst.CSTNode, Set[Tuple]] = {}
            scaler_args: Set[Tuple] = set()
            for scaler in self.scalers:
                for use in scaler.uses:
                    expr = optimizer_argument(use.call) if use.method in ("step", "unscale_") else None
                    if expr is not None:
                        scaler_args.add(optimizer_key(self.names, expr).key)

            for node in self.names.nodes_of_type(cst.Call):  # every call of the module, in order
                if isinstance(node.func, cst.Attribute) and node.func.attr.value == "zero_grad":
                    key = optimizer_key(self.names, node.func.value)
                    if key.stable:
                        zero.setdefault(self.owner_of(node), set()).add(key.key)
            self._opt_receivers = {k: v | scaler_args for k, v in zero.items()}
            self._opt_receivers[None] = scaler_args
        return self._opt_receivers.get(owner, self._opt_receivers[None])

    # ------------------------------------------------------------------ helpers of this file
    def helper_effect(self, call: cst.Call, group: List[Scaler]) -> Optional[Event]:
        """A call to a function of this file: a clip if it only clips/reads gradients, opaque if it
        (or something it calls) may use this scaler; else nothing."""
        definitions = callee_definitions(self.names, call.func)
        attribute_group = any(s.is_attribute for s in group)
        if not definitions:
            if attribute_group and self._may_be_inherited_method(call):
                return Event(OPAQUE, call, detail="a method of this object that is not defined here")
            if attribute_group and any(self._is_self(arg.value) for arg in call.args):
                return Event(OPAQUE, call, detail="the object holding the scaler is passed to a call")
            return self._project_helper(call)
        summaries = [self.summary(func) for func, _ in definitions]
        group_ids = {id(s) for s in group}
        reachable = attribute_group or any(b.scope.kind == "module" for s in group for b in s.bindings)
        if any(s.scalers & group_ids or (s.protocol and reachable) for s in summaries):
            return Event(OPAQUE, call, detail="a function that may use the scaler")
        if all(s.grads for s in summaries) and not any(s.protocol or s.scalers for s in summaries):
            kind = "read" if all(s.grads == "read" for s in summaries) else "clip"
            name = self.code(call.func)
            return Event(CLIP, call, detail=("read:" if kind == "read" else "") + name)
        return None

    def _project_helper(self, call: cst.Call) -> Optional[Event]:
        """A function of another file of the run that clips (or reads) gradients and never
        unscales (engine/project_index.py): a clip here, as a helper of this file would be."""
        index = self.ctx.project_index
        if index is None:
            return None
        for qname in sorted(self.names.qualified_names(call.func)):
            found = index.clip_helper(qname, self.ctx.path)
            if found is not None and found[1] != os.path.abspath(self.ctx.path):
                kind, path = found
                detail = ("read:" if kind == "read" else "") + self.code(call.func)
                return Event(CLIP, call, detail=detail, elsewhere=index.relative(path))
        return None

    def _is_self(self, expr: cst.BaseExpression) -> bool:
        return isinstance(expr, cst.Name) and self.names.method_class_scope(expr) is not None

    def _may_be_inherited_method(self, call: cst.Call) -> bool:
        """`self.m(...)` where `m` is neither defined nor assigned by this class (or its bases in
        this file) and some base class comes from elsewhere: it may use `self.scaler`."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return False
        class_scope = self.names.method_class_scope(func.value)
        if class_scope is None or self.names.self_attribute_bindings(func):
            return False
        classes = [class_scope.node]
        index = 0
        while index < len(classes) and index < 10:
            current = classes[index]
            index += 1
            local = local_bases(self.names, current)
            classes.extend(b for b in local if b not in classes)
            for base in current.bases:
                if isinstance(base.value, cst.Name) and any(b.kind == "class" for b in self.names.bindings_of(base.value)):
                    continue
                qnames = self.names.qualified_names(base.value)
                if not qnames and isinstance(base.value, cst.Name) and base.value.value == "object":
                    continue
                if not qnames or not all(q.startswith(_KNOWN_BASE_MODULES) for q in qnames):
                    return True
        return False

    def summary(self, func: cst.FunctionDef) -> _Summary:
        cached = self._summaries.get(id(func))
        if cached is not None:
            return cached
        if id(func) in self._in_progress or len(self._in_progress) >= _HELPER_DEPTH:
            return _Summary(protocol=True)  # recursion or too deep: assume the worst
        self._in_progress.add(id(func))
        try:
            result = self._compute_summary(func)
        finally:
            self._in_progress.discard(id(func))
        self._summaries[id(func)] = result
        return result

    def _compute_summary(self, func: cst.FunctionDef) -> _Summary:
        summary = _Summary()
        for scaler in self.scalers:
            refs = [u.call for u in scaler.uses] + list(scaler.other_refs)
            if any(self.owner_of(ref) is func for ref in refs):
                summary.scalers.add(id(scaler))
        analyzer = self

        class _Visitor(cst.CSTVisitor):
            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is func

            def visit_Lambda(self, node: cst.Lambda) -> bool:
                return False

            def leave_Call(self, node: cst.Call) -> None:
                callee = node.func
                if isinstance(callee, cst.Attribute) and callee.attr.value == "unscale_":
                    summary.protocol = True  # a scaler this analysis cannot see
                qnames = analyzer.names.qualified_names(callee)
                grads: Optional[str] = None
                if qnames & CLIP_GRAD:
                    grads = "clip"
                elif isinstance(callee, cst.Attribute) and not qnames:
                    if callee.attr.value in CLIP_GRAD_METHODS and not analyzer.self_unscaling(callee.value):
                        grads = "clip"
                    elif callee.attr.value in GRAD_MAGNITUDE_METHODS and analyzer.is_grad(callee.value):
                        grads = "read"
                elif qnames & NORM_FUNCTIONS and node.args and analyzer.holds_grads(node.args[0].value):
                    grads = "read"
                if grads is None:
                    for inner, _ in callee_definitions(analyzer.names, callee):
                        inner_summary = analyzer.summary(inner)
                        summary.scalers |= inner_summary.scalers
                        summary.protocol = summary.protocol or inner_summary.protocol
                        grads = grads or inner_summary.grads
                if grads == "clip" or (grads == "read" and summary.grads is None):
                    summary.grads = grads

        walk(func, _Visitor())
        return summary
