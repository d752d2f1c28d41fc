"""Removing a GradScaler's protocol from a file, or saying why it cannot be removed.

With bf16 autocast a scaler has nothing to do, and with `enabled=False` every one of its
methods is the identity; removing it is the same program as disabling it:

    scaler = GradScaler(...)               -> (removed)
    scaler.scale(loss).backward()          -> loss.backward()
    scaler.unscale_(opt) / scaler.update() -> (removed)
    scaler.step(opt)                       -> opt.step()
    scaler.load_state_dict(sd)             -> (removed)
    {"scaler": scaler.state_dict(), ...}   -> {...}     (the checkpoint entry)
    ckpt["scaler"] = scaler.state_dict()   -> (removed)
    scaler.get_scale()                     -> 1.0       (what a disabled scaler returns)

That holds only when the file shows every use: a scaler passed to a function, returned,
stored elsewhere or tested (`if scaler is not None`), a parameter, or a method outside the list
keeps the scaler, and the reason says where. An `if`/`for` left with nothing in its body is
removed with it when its header has no side effects (`if "scaler" in ckpt:`).

Where it cannot be removed, the same program is had by disabling it where it is made
(`disabling_plan`), when nothing asks it what a disabled scaler answers differently. Whether the
switch to bfloat16 may happen at all (`scalers_that_stay`) is AMP401's question: a scaler that
can be neither removed nor disabled keeps the float16 code with it (issue 16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.scalers import Scaler, ScalerUse, escapes, family, protocol_scalers
from ampmigrate.analysis.values import literal_value
from ampmigrate.analysis.values import snippet
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args, without_items

_STATEMENT_ONLY = ("update", "unscale_", "load_state_dict")
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


class _Blocked(Exception):
    """Raised while planning; the message says why the scaler stays."""


class _GuardBlocked(_Blocked):
    """The scaler is the only guard of a step against inf/NaN gradients: it must stay enabled."""


@dataclass
class RemovalPlan:
    changes: List[Tuple[cst.CSTNode, object]] = field(default_factory=list)
    reason: Optional[str] = None
    guards: bool = False  # blocked because it is a step's only inf/NaN guard: not even disabled

    def apply_to(self, builder: FixBuilder) -> FixBuilder:
        for node, new in self.changes:
            builder.replace(node, new)
        return builder


def inert_under_bf16(scaler: Scaler) -> bool:
    """Created `enabled=False`, or enabled only for float16 runs (wherever the scaler, or one it
    is passed on as, is made): nothing to remove under bf16."""
    creations = [call for member in family(scaler) for call in member.creations]
    return any(_disabled(call) or _enabled_only_for_float16(call) for call in creations)


# What a disabled GradScaler does the same as removing it would: scale/unscale_/update are
# identities, step calls `optimizer.step()`, the state round-trips (an empty dict when disabled),
# get_scale() is 1.0 (what the removal writes for it).
_IDENTITY_WHEN_DISABLED = frozenset({"scale", "unscale_", "step", "update", "state_dict", "load_state_dict", "get_scale"})


def disabling_plan(ctx: FileContext, scaler: Scaler) -> Optional[List[Tuple[cst.CSTNode, cst.CSTNode]]]:
    """`enabled=False` on each creation of a scaler made in this file that AMP402 cannot remove:
    the same program as removing it (each call is then the identity). None when it is not made
    here, guards a step against inf/NaN, or a creation cannot take the keyword."""
    plan = plan_removal(ctx, scaler)
    members = family(scaler)
    creations = [call for m in members for call in m.creations]
    if plan.guards or not creations:
        return None
    if any(u.method not in _IDENTITY_WHEN_DISABLED for m in members for u in m.uses):
        return None  # `is_enabled()`, `get_scale()`: code that would see the difference
    if any(not _seen_elsewhere(ctx, ref) for m in members for ref in escapes(ctx.names, m)):
        return None  # handed to code this file cannot see, which may ask the same

    changes = []
    for call in creations:
        disabled = _disabled_call(call)
        if disabled is None:
            return None
        changes.append((call, disabled))
    return changes


def _seen_elsewhere(ctx: FileContext, ref: cst.BaseExpression) -> bool:
    """`ref` is an argument of a call to a function of another file of the run (the project
    index) that only calls methods a disabled GradScaler answers as a removed one would
    (`load_checkpoint(..., loss_scaler)` calling `loss_scaler.load_state_dict(...)`)."""
    index = ctx.project_index
    arg = ctx.names.parent(ref)
    call = ctx.names.parent(arg) if isinstance(arg, cst.Arg) else None
    if index is None or not isinstance(call, cst.Call) or arg.star:
        return False
    for qname in sorted(ctx.names.qualified_names(call.func)):
        record = index.scaler_parameter_uses(qname, ctx.path)
        if record is None:
            continue
        positional, uses = record
        if arg.keyword is not None:
            param = arg.keyword.value
        else:
            position = [a for a in call.args if a.keyword is None].index(arg)
            param = positional[position] if position < len(positional) else None
        methods = uses.get(param) if param is not None else None
        return methods is not None and set(methods) <= _IDENTITY_WHEN_DISABLED
    return False


@dataclass
class StayingScalers:
    """The GradScalers of a file that scale a loss and cannot be removed with the switch to
    bfloat16: why, and the changes that disable them in place (`enabled=False`) when every one
    is created in this file (None when one comes from elsewhere: a parameter, another module)."""

    reason: Optional[str] = None
    disable: Optional[List[Tuple[cst.CSTNode, cst.CSTNode]]] = None


def scalers_that_stay(ctx: FileContext) -> StayingScalers:
    return ctx.shared("scaler_removal.staying", lambda: _scalers_that_stay(ctx))


def _scalers_that_stay(ctx: FileContext) -> StayingScalers:
    """The switch of autocast to bfloat16 (AMP401) and the scaler's removal (AMP402) go together:
    a bfloat16 region beside a float16 loss scaler that stays is a half migration (issue 16: both
    move, or neither). Where AMP402 cannot remove a scaler (it is passed to other functions,
    tested, stored), it disables it where it is made, once every autocast of the file runs in
    bfloat16 (`disable`); where the scaler is made elsewhere, or is a step's only inf/NaN guard,
    AMP401 withholds its fix (`disable` is None)."""
    reasons: List[str] = []
    disable: Optional[List[Tuple[cst.CSTNode, cst.CSTNode]]] = []
    for scaler, _members, plan in _staying_plans(ctx):
        reasons.append(f"`{scaler.display}` would stay ({plan.reason})")
        changes = disabling_plan(ctx, scaler)  # None: a guard, or made elsewhere
        disable = None if changes is None or disable is None else [*disable, *changes]
    if not reasons:
        return StayingScalers()
    return StayingScalers("; ".join(reasons), disable)


def _staying_plans(ctx: FileContext) -> List[Tuple[Scaler, List[Scaler], "RemovalPlan"]]:
    """(scaler, its family, its removal plan) for each family that scales a loss and that AMP402
    cannot remove: planned once per file (AMP401 asks for every autocast it reports)."""

    def plans() -> List[Tuple[Scaler, List[Scaler], RemovalPlan]]:
        seen: Set[int] = set()
        found: List[Tuple[Scaler, List[Scaler], RemovalPlan]] = []
        for scaler in protocol_scalers(ctx):  # a parameter used as a GradScaler counts (it stays)
            members = family(scaler)
            if id(members[0]) in seen:
                continue
            seen.update(id(m) for m in members)
            if inert_under_bf16(scaler) or not any(m.calls("scale") for m in members):
                continue
            plan = plan_removal(ctx, scaler)
            if plan.reason is not None:  # else AMP402 removes it once autocast runs in bfloat16
                found.append((scaler, members, plan))
        return found

    return ctx.shared("precision.staying_scalers", plans)


def _disabled_call(call: cst.Call) -> Optional[cst.Call]:
    """`GradScaler(...)` with `enabled=False` (replacing a given `enabled=`); None when `enabled`
    may be passed positionally or through `*`/`**`."""
    args = list(call.args)
    if any(a.star for a in args) or sum(1 for a in args if a.keyword is None) > 1:
        return None  # `GradScaler("cuda", 2.0**16, ...)`: positions differ between the two APIs
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value == "enabled")]
    off = cst.Arg(
        cst.Name("False"),
        keyword=cst.Name("enabled"),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    return rebuild_args(call, [*kept, off])


def plan_removal(ctx: FileContext, scaler: Scaler) -> RemovalPlan:
    """Planned once per scaler and file (AMP401 asks for every autocast, AMP402 for every scaler)."""
    plans: Dict[int, RemovalPlan] = ctx.shared("scaler_removal.plans", dict)
    plan = plans.get(id(scaler))
    if plan is None:
        planner = _Planner(ctx, scaler)
        try:
            plan = RemovalPlan(planner.plan())
        except _Blocked as exc:
            plan = RemovalPlan(reason=str(exc), guards=isinstance(exc, _GuardBlocked) or planner.only_guard())
        plans[id(scaler)] = plan
    return plan


class _Planner:
    def __init__(self, ctx: FileContext, scaler: Scaler) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.scaler = scaler
        self.removed: List[cst.CSTNode] = []  # statements (lines or small statements) to remove
        self.replaced: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.dropped_items: Dict[cst.CSTNode, List[cst.CSTNode]] = {}  # container -> items

    def plan(self) -> List[Tuple[cst.CSTNode, object]]:
        scaler = self.scaler
        name = f"`{scaler.display}`"
        for binding in scaler.bindings:
            if binding.value is not None and binding.value not in scaler.creations:
                raise _Blocked(
                    f"{name} is given a value other than a new GradScaler at line {self._line(binding.node)} "
                    f"(`{snippet(self.ctx, binding.node)}`)"
                )
        if not scaler.creations or any(b.value is None for b in scaler.bindings):
            raise _Blocked(f"{name} is not (only) created in this file: a parameter, or set elsewhere")
        if scaler.other_refs:
            ref = scaler.other_refs[0]
            raise _Blocked(
                f"{name} is used as a value at line {self._line(ref)} (`{snippet(self.ctx, ref)}`): "
                "passed, returned, stored or tested there, so removing it needs a hand"
            )
        for binding in scaler.bindings:
            assign = binding.statement
            if not isinstance(assign, (cst.Assign, cst.AnnAssign)) or len(getattr(assign, "targets", [None])) != 1:
                raise _Blocked(f"the statement that creates {name} also does something else")
            self._remove_statement(assign)
        for use in scaler.uses:
            self._plan_use(use)
        for creation in scaler.creations:
            self._drop_unused_import(creation.func)
        return self._changes()

    def _drop_unused_import(self, callee: cst.BaseExpression) -> None:
        """`from torch.amp import GradScaler` goes when the removed creations were its only uses."""
        if not isinstance(callee, cst.Name):
            return
        bindings = self.names.bindings_of(callee)
        if len(bindings) != 1 or bindings[0].kind != "from-import":
            return
        binding = bindings[0]
        creations = {id(c.func) for c in self.scaler.creations}
        if any(id(ref) not in creations for ref in self.names.references(binding)):
            return
        statement = binding.statement
        line = self.names.parent(statement)
        if not isinstance(line, cst.SimpleStatementLine) or isinstance(
            self.names.parent(self.names.parent(line)), cst.Try
        ):
            return  # a try-import fallback keeps its shape
        if len(statement.names) == 1:
            self._remove_statement(statement)
        else:
            self._drop_item(statement, binding.node)

    # ------------------------------------------------------------------ uses
    def _plan_use(self, use: ScalerUse) -> None:
        method, call = use.method, use.call
        if method == "scale":
            self.replaced[call] = self._parenthesized(call, self._only_argument(use, "outputs"))
        elif method == "step":
            self._check_finiteness_guard(use)
            self.replaced[call] = self._optimizer_step(use)
        elif method in _STATEMENT_ONLY:
            if not self._is_statement(call):
                raise self._unsupported(use, "its result is used")
            self._remove_statement(self.names.parent(call))
        elif method in ("state_dict", "get_scale"):
            self._plan_value(use)
        else:
            raise self._unsupported(use, "it has no equivalent without a scaler")

    def _plan_value(self, use: ScalerUse) -> None:
        call = use.call
        parent = self.names.parent(call)
        if self._is_statement(call):
            self._remove_statement(parent)
        elif isinstance(parent, cst.DictElement) and parent.value is call:
            self._drop_item(self.names.parent(parent), parent)
        elif (
            isinstance(parent, cst.Arg) and parent.keyword is not None and self._is_dict_call(self.names.parent(parent))
        ):
            self._drop_item(self.names.parent(parent), parent)
        elif (
            isinstance(parent, cst.Assign)
            and parent.value is call
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, (cst.Subscript, cst.Attribute))
        ):
            self._remove_statement(parent)  # ckpt["scaler"] = scaler.state_dict()
        elif use.method == "get_scale":
            self.replaced[call] = cst.Float("1.0")
        else:
            raise self._unsupported(use, "its result goes somewhere other than a checkpoint entry")

    def _only_argument(self, use: ScalerUse, keyword: str) -> cst.BaseExpression:
        args = use.call.args
        if len(args) != 1 or args[0].star or (args[0].keyword is not None and args[0].keyword.value != keyword):
            raise self._unsupported(use, "its arguments are not a single value")
        return args[0].value

    def _optimizer_step(self, use: ScalerUse) -> cst.Call:
        args = list(use.call.args)
        if not args or args[0].keyword is not None or args[0].star:
            raise self._unsupported(use, "the optimizer is not its first positional argument")
        optimizer = args[0].value
        if not isinstance(optimizer, _ATOMS):
            optimizer = optimizer.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        rest = rebuild_args(use.call, args[1:]).args if len(args) > 1 else []
        return cst.Call(
            func=cst.Attribute(value=optimizer, attr=cst.Name("step")),
            args=rest,
            lpar=use.call.lpar,
            rpar=use.call.rpar,
        )

    def only_guard(self) -> bool:
        """Some step of the scaler is its function's only inf/NaN guard (whatever else blocks)."""
        for use in self.scaler.uses:
            if use.method == "step":
                try:
                    self._check_finiteness_guard(use)
                except _GuardBlocked:
                    return True
        return False

    def _check_finiteness_guard(self, use: ScalerUse) -> None:
        """The scaler skips a step whose gradients hold inf/NaN. Where the same function guards its
        other (fp32) `optimizer.step()` with a finiteness test and this one has none, the code relied on
        the scaler for that: `opt.step()` alone would apply NaN updates (issue 16)."""
        call = use.call
        ancestors = list(self.names.ancestors(call))
        if any(_tests_finiteness(node) for node in ancestors):
            return
        function = next((a for a in ancestors if isinstance(a, cst.FunctionDef)), None)
        for guard in _finiteness_ifs(self.ctx).get(function, ()):
            other = _other_step(guard, call)
            if other is not None:
                raise _GuardBlocked(
                    f"`{self.ctx.code(call)}` at line {self._line(call)} is the only guard against inf/NaN "
                    f"gradients there (the scaler skips such steps), while `{self.ctx.code(other)}` at line "
                    f"{self._line(other)} is guarded by a finiteness test: guard this step the same way, then "
                    "remove the scaler"
                )

    def _parenthesized(self, call: cst.Call, value: cst.BaseExpression) -> cst.BaseExpression:
        parent = self.names.parent(call)
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is call
            and not isinstance(value, _ATOMS)
            and not value.lpar
        ):
            return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return value

    def _unsupported(self, use: ScalerUse, why: str) -> _Blocked:
        return _Blocked(f"`{self.ctx.code(use.call)}` at line {self._line(use.call)} cannot be removed: {why}")

    # ------------------------------------------------------------------ statements and items
    def _is_statement(self, call: cst.Call) -> bool:
        parent = self.names.parent(call)
        return isinstance(parent, cst.Expr) and parent.value is call

    def _is_dict_call(self, node: Optional[cst.CSTNode]) -> bool:
        return (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "dict"
            and not self.names.bindings_of(node.func)
        )

    def _remove_statement(self, small: cst.CSTNode) -> None:
        line = self.names.parent(small)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            self.removed.append(line)
        else:
            self.removed.append(small)  # one of several on a line; LibCST keeps the line valid

    def _drop_item(self, container: cst.CSTNode, item: cst.CSTNode) -> None:
        self.dropped_items.setdefault(container, []).append(item)

    # ------------------------------------------------------------------ putting it together
    def _changes(self) -> List[Tuple[cst.CSTNode, object]]:
        removed = self._collapse(set(self.removed))
        changes: List[Tuple[cst.CSTNode, object]] = []
        for node in removed:
            line = self.names.parent(node)
            if isinstance(node, cst.BaseSmallStatement) and isinstance(line, cst.SimpleStatementLine):
                continue  # rewritten with its line below
            changes.append((node, cst.RemovalSentinel.REMOVE))
        lines = {self.names.parent(n) for n in removed if isinstance(n, cst.BaseSmallStatement)}
        for line in lines:
            changes.append((line, self._rewrite_line(line, removed)))
        changes.extend(
            (node, new)
            for node, new in self.replaced.items()
            if not any(a in lines for a in self.names.ancestors(node))
        )
        for container, items in self.dropped_items.items():
            changes.append((container, without_items(container, items)))
        targets = [node for node, _ in changes]
        target_set = set(targets)
        for node in targets:
            if any(ancestor in target_set for ancestor in self.names.ancestors(node)):
                raise _Blocked("two of its uses are nested in one another")
        return changes

    def _rewrite_line(self, line: cst.SimpleStatementLine, removed) -> cst.CSTNode:
        """`a(); scaler.update()` -> `a()`: the kept statements, with this plan's replacements
        inside them, and the last one's semicolon as the line's last had it."""
        replacements = self.replaced

        class _Replace(cst.CSTTransformer):
            def on_leave(self, original_node, updated_node):
                return replacements.get(original_node, updated_node)

        kept = [small.visit(_Replace()) for small in line.body if small not in removed]
        if not kept:
            return cst.RemovalSentinel.REMOVE
        kept[-1] = kept[-1].with_changes(semicolon=line.body[-1].semicolon)
        return line.with_changes(body=kept)

    def _collapse(self, removed: Set[cst.CSTNode]) -> List[cst.CSTNode]:
        """An `if`/`for` whose whole body goes, and whose header does nothing, goes too."""
        changed = True
        while changed:
            changed = False
            for block_owner in {self._block_owner(node) for node in removed} - {None}:
                body = block_owner.body.body
                if all(statement in removed for statement in body) and self._removable_header(block_owner):
                    removed -= set(body)
                    removed.add(block_owner)
                    changed = True
                    break
        return sorted(removed, key=lambda n: self._line(n))

    def _block_owner(self, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
        block = self.names.parent(statement)
        owner = self.names.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, (cst.If, cst.For)) and owner.body is block and owner.orelse is None:
            if isinstance(owner, cst.If) and isinstance(self.names.parent(owner), cst.If):
                return None  # an `elif`: removing it would change the chain
            return owner
        return None

    def _removable_header(self, owner: cst.CSTNode) -> bool:
        header = owner.test if isinstance(owner, cst.If) else owner.iter
        if isinstance(owner, cst.For) and owner.asynchronous is not None:
            return False
        return _is_pure(header)

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line


_FINITENESS = frozenset({"isfinite", "isnan", "isinf"})


def _tests_finiteness(node: cst.CSTNode) -> bool:
    """An `if` whose test calls isfinite/isnan/isinf (torch's, math's or a tensor method)."""
    if not isinstance(node, cst.If):
        return False
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            nonlocal found
            func = call.func
            name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
            found = found or name in _FINITENESS

    node.test.visit(_Finder())
    return found


def _finiteness_ifs(ctx: FileContext) -> Dict[Optional[cst.FunctionDef], List[cst.If]]:
    """The `if`s testing finiteness, by the function they are in (None: the module), found once
    per file."""

    def build() -> Dict[Optional[cst.FunctionDef], List[cst.If]]:
        found: Dict[Optional[cst.FunctionDef], List[cst.If]] = {}
        for node in ctx.names.nodes_of_type(cst.If):
            if _tests_finiteness(node):
                found.setdefault(ctx.names.enclosing(node, cst.FunctionDef), []).append(node)
        return found

    return ctx.shared("scaler_removal.finiteness_ifs", build)


def _other_step(guard: cst.If, scaler_step: cst.Call) -> Optional[cst.Call]:
    """An `x.step()` call (with no argument: an optimizer's) under `guard`'s body, other than `scaler_step`."""
    found: List[cst.Call] = []

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if (
                call is not scaler_step
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "step"
                and not call.args
            ):
                found.append(call)

    guard.body.visit(_Finder())
    return found[0] if found else None


def _is_pure(expression: cst.CSTNode) -> bool:
    """No calls, awaits, walruses or yields: evaluating it changes nothing."""
    impure = False

    class _Finder(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal impure
            if isinstance(node, (cst.Call, cst.Await, cst.NamedExpr, cst.Yield, cst.Lambda)):
                impure = True
            return not impure

    expression.visit(_Finder())
    return not impure


def _disabled(call) -> bool:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "enabled":
            return literal_value(arg.value) is False
    return False


_FLOAT16_SPELLINGS = {"float16", "fp16", "half", "torch.float16", "torch.half"}


def _enabled_only_for_float16(call) -> bool:
    """`enabled=(dtype == "float16")` (llama2.c, nanoGPT): the scaler runs only in float16 runs."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "enabled":
            test = arg.value
            if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
                return False
            if not isinstance(test.comparisons[0].operator, cst.Equal):
                return False
            sides = (test.left, test.comparisons[0].comparator)
            return any(_spells_float16(side) for side in sides)
    return False


def _spells_float16(node) -> bool:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value in _FLOAT16_SPELLINGS
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        return f"{node.value.value}.{node.attr.value}" in _FLOAT16_SPELLINGS
    return False
