"""A small, path-aware walk over one function body's statements (no full CFG).

Rules about call order (`backward` before `unscale_` before `step` before `update`) need to know
what can run before what along each path of a loop body. This module gives two tools:

`FlowWalker` runs a client's transfer function over the body in execution order: `if` branches
are walked separately and joined, loops are iterated until the state at their head stops
growing (so what one iteration leaves behind reaches the next), `break`/`continue`/`return`
end their paths, and a `try` body may jump to its handlers. The state is *path-sensitive in
a small way*: the walker remembers the value of an `if` condition it has assumed, so that two
tests of the same condition agree (`if use_amp: scaler.unscale_(opt)` ... `if use_amp:
scaler.step(opt)` never combines the first `True` with the second `False`). Which
conditions are remembered, and for how long, is decided by `Conditions`:

- a *stable* condition (`args.clip`, `scaler is not None`, `use_amp`: no calls, none of its
  names rebound in a loop) keeps its value for the whole run of the function;
- a *varying* condition (`(i + 1) % accum == 0`) keeps its value within one iteration, until a
  name it reads is rebound (the loop target at each iteration head, an assignment), and is
  remembered at all only if the same test occurs twice;
- a condition with calls in it is forgotten at every loop head.

Only conditions whose branches hold something the client cares about are remembered, so the
number of distinct paths stays small (capped: beyond it the walk gives up, and rules stay
silent rather than guess).

Two deliberate approximations, both toward silence: a loop runs its body at least once (a
training loop over batches, or `for opt in optimizers: scaler.unscale_(opt)`, is never empty in
practice), and an `except`/`finally` block starts from the state after some statement of the
`try` body ran (a path that raised before anything happened is an error path, not a protocol).

`reaches(...)` answers the forward question a fix needs: from this statement, does every path
reach a given event before a disqualifying one (and before the loop iterates again)?
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    Callable,
    Dict,
    FrozenSet,
    Generic,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

import libcst as cst

from ampmigrate.analysis.statements import block_of, enclosing_compound, in_loop_body
from ampmigrate.engine.cst_walk import nodes_of_type, walk
from ampmigrate.engine.names import NameIndex, dotted

F = TypeVar("F")
Assignment = FrozenSet[Tuple[str, bool]]
State = Dict[Assignment, F]  # path condition -> facts; {} = unreachable

MAX_PATHS = 64
MAX_WALKS = 12
_PURE_CALLS = frozenset({"isinstance", "hasattr", "getattr", "len", "callable"})
_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


class TooComplex(Exception):
    """The walk would need more paths (or iterations) than the caps allow."""


# ---------------------------------------------------------------------------------- conditions
@dataclass
class Var:
    key: str
    names: FrozenSet[str]  # dotted names the condition reads (`args`, `args.clip`)
    volatile: bool  # contains a call: may change between two evaluations
    stable: bool = True  # not rebound in any loop of the body, and not volatile
    occurrences: int = 0
    relevant: bool = False

    @property
    def tracked(self) -> bool:
        if not self.relevant:
            return False
        return self.stable or self.occurrences >= 2


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    if getattr(node, "lpar", None):
        return node.with_changes(lpar=[], rpar=[])
    return node


class Conditions:
    """The `if`/`while` conditions of one body, split into atoms the walker can remember."""

    def __init__(self, module: cst.Module, body: Sequence[cst.BaseStatement], relevant: Callable[[cst.CSTNode], bool]) -> None:
        self.module = module
        self.vars: Dict[str, Var] = {}
        self._atom_keys: Dict[cst.CSTNode, str] = {}
        loop_bound: Set[str] = set()
        tests: List[Tuple[cst.BaseExpression, cst.CSTNode]] = []
        _collect(body, tests, loop_bound, in_loop=False)
        for test, owner in tests:
            owner_relevant = relevant(owner)
            for atom in self._atoms(test):
                var = self._var(atom)
                var.occurrences += 1
                var.relevant = var.relevant or owner_relevant
        for var in self.vars.values():
            var.stable = not var.volatile and not any(_overlaps(n, loop_bound) for n in var.names)

    # An atom is a condition without `not`/`and`/`or`/`is None` around it.
    def _atoms(self, test: cst.BaseExpression) -> Iterable[cst.BaseExpression]:
        test = _strip_parens(test)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            yield from self._atoms(test.expression)
        elif isinstance(test, cst.BooleanOperation):
            yield from self._atoms(test.left)
            yield from self._atoms(test.right)
        elif _none_test(test) is not None:
            yield from self._atoms(test.left)
        else:
            yield test

    def _var(self, atom: cst.BaseExpression) -> Var:
        key = self.key(atom)
        var = self.vars.get(key)
        if var is None:
            names, volatile = _reads(atom)
            var = self.vars[key] = Var(key, frozenset(names), volatile)
        return var

    def key(self, atom: cst.BaseExpression) -> str:
        cached = self._atom_keys.get(atom)
        if cached is None:
            code = self.module.code_for_node(_strip_parens(atom))
            cached = self._atom_keys[atom] = "".join(code.split())
        return cached

    def tracked(self, atom: cst.BaseExpression) -> Optional[str]:
        var = self.vars.get(self.key(atom))
        return var.key if var is not None and var.tracked else None

    def affected_by(self, bound: Iterable[str]) -> Set[str]:
        """Tracked conditions that read one of the rebound names."""
        bound = list(bound)
        return {v.key for v in self.vars.values() if v.tracked and any(_overlaps(n, bound) for n in v.names)}

    def volatile(self) -> Set[str]:
        return {v.key for v in self.vars.values() if v.tracked and not v.stable}

    def stable_keys(self) -> Set[str]:
        return {v.key for v in self.vars.values() if v.tracked and v.stable}


def _none_test(test: cst.BaseExpression) -> Optional[bool]:
    """`x is None` -> False (x is falsy-ish), `x is not None` -> True; else None."""
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        operator = test.comparisons[0].operator
        if isinstance(operator, cst.IsNot):
            return True
        if isinstance(operator, cst.Is):
            return False
    return None


def _overlaps(name: str, others: Iterable[str]) -> bool:
    for other in others:
        if name == other or name.startswith(other + ".") or other.startswith(name + "."):
            return True
    return False


def _reads(expr: cst.CSTNode) -> Tuple[Set[str], bool]:
    names: Set[str] = set()
    volatile = False

    class _Visitor(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
            name = dotted(node)
            if name is not None:
                names.add(name)
                names.add(name.split(".")[0])
                return False
            return True

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal volatile
            if not (isinstance(node.func, cst.Name) and node.func.value in _PURE_CALLS):
                volatile = True

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

    walk(expr, _Visitor())
    return names, volatile


def bound_names(node: cst.CSTNode) -> Set[str]:
    """Dotted names a small statement (or loop/with target) rebinds."""
    out: Set[str] = set()

    def targets(target: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                targets(element.value)
        elif isinstance(target, cst.StarredElement):
            targets(target.value)
        else:
            name = dotted(target)
            if name is not None:
                out.add(name)

    if isinstance(node, cst.Assign):
        for target in node.targets:
            targets(target.target)
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        targets(node.target)
    elif isinstance(node, (cst.For, cst.CompFor)):
        targets(node.target)
    elif isinstance(node, cst.WithItem) and node.asname is not None:
        targets(node.asname.name)
    elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(getattr(node, "names", None), cst.ImportStar):
        for alias in node.names:
            if alias.asname is not None:
                targets(alias.asname.name)
            else:
                name = dotted(alias.name)
                if name:
                    out.add(name.split(".")[0])
    elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        out.add(node.name.value)
    else:
        return out

    # Walrus targets inside the statement.
    # Walrus targets inside the statement: of a loop or `with` item only in its header (its body's
    # statements are asked about one by one; walking the body here is quadratic in nested loops).
    if isinstance(node, cst.For):
        header: Sequence[cst.CSTNode] = (node.iter,)
    elif isinstance(node, cst.CompFor):
        header = (node.iter, *node.ifs)
    elif isinstance(node, cst.WithItem):
        header = (node.item,)
    elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        header = ()
    else:
        header = (node,)
    for part in header:
        out |= walrus_targets(part)
    return out


def walrus_targets(node: cst.CSTNode) -> Set[str]:
    """Names bound by `:=` anywhere in `node`."""
    return {name for walrus in nodes_of_type(node, cst.NamedExpr) if (name := dotted(walrus.target)) is not None}


def _collect(body: Sequence[cst.CSTNode], tests: list, loop_bound: Set[str], in_loop: bool) -> None:
    """Every if/while test of the body with its statement, and the names rebound inside loops."""
    for statement in body:
        if isinstance(statement, _SCOPES):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            if in_loop:
                for small in statement.body:
                    loop_bound |= bound_names(small)
            continue
        if isinstance(statement, (cst.If, cst.While)):
            tests.append((statement.test, statement))
            if in_loop or isinstance(statement, cst.While):
                loop_bound |= walrus_targets(statement.test)
        inner_loop = in_loop or isinstance(statement, _LOOPS)
        if isinstance(statement, cst.For):
            loop_bound |= bound_names(statement)
        if isinstance(statement, cst.With) and inner_loop:
            for item in statement.items:
                loop_bound |= bound_names(item)
        for block in _child_blocks(statement):
            _collect(block, tests, loop_bound, inner_loop)


def _child_blocks(statement: cst.CSTNode) -> List[Sequence[cst.CSTNode]]:
    blocks: List[Sequence[cst.CSTNode]] = []
    if isinstance(statement, cst.If):
        blocks.append(_statements(statement.body))
        if statement.orelse is not None:
            if isinstance(statement.orelse, cst.If):
                blocks.append([statement.orelse])
            else:
                blocks.append(_statements(statement.orelse.body))
    elif isinstance(statement, (cst.For, cst.While)):
        blocks.append(_statements(statement.body))
        if statement.orelse is not None:
            blocks.append(_statements(statement.orelse.body))
    elif isinstance(statement, cst.With):
        blocks.append(_statements(statement.body))
    elif isinstance(statement, (cst.Try, cst.TryStar)):
        blocks.append(_statements(statement.body))
        for handler in statement.handlers:
            blocks.append(_statements(handler.body))
        if statement.orelse is not None:
            blocks.append(_statements(statement.orelse.body))
        if statement.finalbody is not None:
            blocks.append(_statements(statement.finalbody.body))
    elif isinstance(statement, cst.Match):
        for case in statement.cases:
            blocks.append(_statements(case.body))
    return blocks


def _statements(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return suite.body
    return [suite]  # SimpleStatementSuite: `if x: a(); b()` - walked like a line


# ---------------------------------------------------------------------------------- the walker
class FlowClient(Generic[F]):
    """What a walk computes: facts, how they merge, and what each unit of code does to them.

    A unit is a small statement, or an expression a compound statement evaluates (an `if`
    test, a `for` iterable, a `with` item). `record` is True on the final walk only, when the
    facts at every unit are final: clients record what they observe then.
    """

    def join(self, a: F, b: F) -> F:  # pragma: no cover - interface
        raise NotImplementedError

    def transfer(self, facts: F, unit: cst.CSTNode, assignment: Assignment, record: bool) -> F:  # pragma: no cover
        raise NotImplementedError


@dataclass
class _Frame:
    breaks: List[State] = field(default_factory=list)
    continues: List[State] = field(default_factory=list)


class FlowWalker(Generic[F]):
    def __init__(self, body: Sequence[cst.BaseStatement], client: FlowClient[F], conditions: Conditions) -> None:
        self.body = body
        self.client = client
        self.conditions = conditions
        self.heads: Dict[cst.CSTNode, State] = {}
        self.record = False
        self._changed = False
        self._frames: List[_Frame] = []
        self._volatile = conditions.volatile()
        self._rebinds: Dict[int, Set[str]] = {}  # node id -> tracked conditions it invalidates

    def run(self, entry: F) -> None:
        """Walk until loop heads are stable, then once more with `record` on. Raises TooComplex."""
        for _ in range(MAX_WALKS):
            self._changed = False
            self._block(self.body, {frozenset(): entry})
            if not self._changed:
                break
        else:
            raise TooComplex("loop states did not settle")
        self.record = True
        self._block(self.body, {frozenset(): entry})

    # ------------------------------------------------------------------ state algebra
    def join(self, *states: State) -> State:
        out: State = {}
        for state in states:
            for key, facts in state.items():
                out[key] = facts if key not in out else self.client.join(out[key], facts)
        if len(out) > MAX_PATHS:
            raise TooComplex("too many paths")
        return out

    def forget(self, state: State, keys: Set[str]) -> State:
        if not keys or not state:
            return state
        out: State = {}
        for assignment, facts in state.items():
            kept = frozenset(item for item in assignment if item[0] not in keys)
            out[kept] = facts if kept not in out else self.client.join(out[kept], facts)
        return out

    def assume(self, state: State, test: cst.BaseExpression, value: bool) -> State:
        if not state:
            return state
        test = _strip_parens(test)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.assume(state, test.expression, not value)
        if isinstance(test, cst.BooleanOperation):
            conjunction = isinstance(test.operator, cst.And)
            if value == conjunction:  # `a and b` true / `a or b` false: both sides take the value
                return self.assume(self.assume(state, test.left, value), test.right, value)
            # `a and b` false: a is false, or a is true and b false (dually for `or`).
            first = self.assume(state, test.left, value)
            second = self.assume(self.assume(state, test.left, not value), test.right, value)
            return self.join(first, second)
        polarity = _none_test(test)
        if polarity is not None:
            return self.assume(state, test.left, value == polarity)
        key = self.conditions.tracked(test)
        if key is None:
            return state
        out: State = {}
        for assignment, facts in state.items():
            known = dict(assignment)
            if key in known:
                if known[key] != value:
                    continue  # this path already took the other branch of the same test
                new = assignment
            else:
                new = assignment | {(key, value)}
            out[new] = facts if new not in out else self.client.join(out[new], facts)
        if len(out) > MAX_PATHS:
            raise TooComplex("too many paths")
        return out

    def _invalidated(self, node: cst.CSTNode) -> Set[str]:
        """Tracked conditions that the names `node` rebinds make stale (cached: walks repeat)."""
        found = self._rebinds.get(id(node))
        if found is None:
            found = self._rebinds[id(node)] = self.conditions.affected_by(bound_names(node))
        return found

    def apply(self, state: State, unit: cst.CSTNode) -> State:
        return {a: self.client.transfer(f, unit, a, self.record) for a, f in state.items()}

    # ------------------------------------------------------------------ statements
    def _block(self, statements: Sequence[cst.CSTNode], state: State) -> State:
        for statement in statements:
            if not state:
                return state
            state = self._statement(statement, state)
        return state

    def _statement(self, statement: cst.CSTNode, state: State) -> State:
        if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return self._line(statement.body, state)
        if isinstance(statement, _SCOPES):
            return self.forget(state, self._invalidated(statement))
        if isinstance(statement, cst.If):
            state = self.apply(state, statement.test)
            taken = self._block(_statements(statement.body), self.assume(state, statement.test, True))
            other = self.assume(state, statement.test, False)
            if isinstance(statement.orelse, cst.If):
                other = self._statement(statement.orelse, other)
            elif statement.orelse is not None:
                other = self._block(_statements(statement.orelse.body), other)
            return self.join(taken, other)
        if isinstance(statement, cst.For):
            return self._loop(statement, self.apply(state, statement.iter))
        if isinstance(statement, cst.While):
            return self._loop(statement, state)
        if isinstance(statement, cst.With):
            for item in statement.items:
                state = self.apply(state, item.item)
                state = self.forget(state, self._invalidated(item))
            return self._block(_statements(statement.body), state)
        if isinstance(statement, (cst.Try, cst.TryStar)):
            return self._try(statement, state)
        if isinstance(statement, cst.Match):
            state = self.apply(state, statement.subject)
            outs = [state]  # no case may match
            for case in statement.cases:
                outs.append(self._block(_statements(case.body), state))
            return self.join(*outs)
        return state

    def _line(self, smalls: Sequence[cst.BaseSmallStatement], state: State) -> State:
        for small in smalls:
            if not state:
                return state
            state = self.apply(state, small)
            if isinstance(small, (cst.Return, cst.Raise)):
                return {}
            if isinstance(small, (cst.Break, cst.Continue)):
                if self._frames:
                    frame = self._frames[-1]
                    (frame.breaks if isinstance(small, cst.Break) else frame.continues).append(state)
                return {}
            state = self.forget(state, self._invalidated(small))
        return state

    def _loop(self, loop, state: State) -> State:
        """A loop is taken to run its body at least once: training loops over batches, epochs
        and optimizers do, and a zero-iteration path would claim that `for opt in opts:
        scaler.unscale_(opt)` may not have unscaled anything."""
        head = self.join(state, self.heads.get(loop, {}))
        entry = self.forget(head, self._volatile)
        if isinstance(loop, cst.For):
            entry = self.forget(entry, self._invalidated(loop))
        if isinstance(loop, cst.While):
            entry = self.apply(entry, loop.test)
            forever = isinstance(loop.test, (cst.Name, cst.Integer)) and getattr(loop.test, "value", None) in ("True", "1")
            body_entry = self.assume(entry, loop.test, True)
        else:
            forever = False
            body_entry = entry
        self._frames.append(_Frame())
        body_out = self._block(_statements(loop.body), body_entry)
        frame = self._frames.pop()
        back = self.join(body_out, *frame.continues)
        stored = self.heads.get(loop, {})
        merged = self.join(stored, back)
        if merged != stored:
            self.heads[loop] = merged
            self._changed = True
        # Normal exit: the test (or the iterator) fails after an iteration.
        if forever:
            exit_state: State = {}
        elif isinstance(loop, cst.While):
            exit_state = self.assume(self.apply(self.forget(merged, self._volatile), loop.test), loop.test, False)
        else:
            exit_state = merged
        if loop.orelse is not None:
            exit_state = self._block(_statements(loop.orelse.body), exit_state)
        return self.join(exit_state, *frame.breaks)

    def _try(self, statement, state: State) -> State:
        """Handlers start from the state after any statement of the body. Not from the state
        before it: a path that raises at once and then runs the handler (or `finally`) is an
        error path the rules should not reason about."""
        seen = []
        current = state
        for inner in _statements(statement.body):
            if not current:
                break
            current = self._statement(inner, current)
            seen.append(current)
        handler_in = self.join(*seen) if seen else state
        outs = []
        for handler in statement.handlers:
            outs.append(self._block(_statements(handler.body), handler_in))
        if statement.orelse is not None:
            current = self._block(_statements(statement.orelse.body), current)
        out = self.join(current, *outs)
        if statement.finalbody is not None:
            out = self._block(_statements(statement.finalbody.body), out)
        return out


# ---------------------------------------------------------------------------------- forward scan
HIT, STOP, THROUGH, BREAK, CONTINUE = "hit", "stop", "through", "break", "continue"


def reaches(names: NameIndex, statement: cst.BaseStatement, classify: Callable[[cst.CSTNode], Optional[str]]) -> bool:
    """True when every path from `statement` (inclusive) meets a unit that `classify` calls HIT
    before one it calls STOP, before a `return`, and before leaving the loop iteration or the
    function. Paths that raise are ignored. Events inside a nested loop count as STOP: they
    would run a number of times the scan cannot know.
    """
    scanner = _Scanner(classify)
    current: cst.CSTNode = statement
    outcomes: Set[str] = {THROUGH}
    first = True
    while THROUGH in outcomes:
        outcomes.discard(THROUGH)
        block, index = block_of(names, current)
        if block is None:
            return False
        rest = block[index:] if first else block[index + 1 :]
        first = False
        outcomes |= scanner.block(rest)
        if THROUGH not in outcomes:
            break
        owner = enclosing_compound(names, current)
        if owner is None or isinstance(owner, (cst.FunctionDef, cst.Module)):
            outcomes.discard(THROUGH)
            outcomes.add(STOP)  # the function ends without the event
            break
        if isinstance(owner, _LOOPS) and in_loop_body(names, current, owner):
            outcomes.discard(THROUGH)
            outcomes.add(STOP)  # the next iteration starts without the event
            break
        current = owner
    return outcomes == {HIT}


class _Scanner:
    def __init__(self, classify: Callable[[cst.CSTNode], Optional[str]]) -> None:
        self.classify = classify

    def block(self, statements: Sequence[cst.CSTNode]) -> Set[str]:
        result: Set[str] = set()
        for statement in statements:
            outs = self.statement(statement)
            result |= outs - {THROUGH}
            if THROUGH not in outs:
                return result
        result.add(THROUGH)
        return result

    def unit(self, node: cst.CSTNode) -> Optional[Set[str]]:
        decision = self.classify(node)
        return {decision} if decision is not None else None

    def statement(self, statement: cst.CSTNode) -> Set[str]:
        if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in statement.body:
                decided = self.unit(small)
                if decided is not None:
                    return decided
                if isinstance(small, cst.Return):
                    return {STOP}
                if isinstance(small, cst.Raise):
                    return set()
                if isinstance(small, cst.Break):
                    return {BREAK}
                if isinstance(small, cst.Continue):
                    return {CONTINUE}
            return {THROUGH}
        if isinstance(statement, _SCOPES):
            return {THROUGH}
        if isinstance(statement, cst.If):
            decided = self.unit(statement.test)
            if decided is not None:
                return decided
            outs = self.block(_statements(statement.body))
            if isinstance(statement.orelse, cst.If):
                outs |= self.statement(statement.orelse)
            elif statement.orelse is not None:
                outs |= self.block(_statements(statement.orelse.body))
            else:
                outs.add(THROUGH)
            return outs
        if isinstance(statement, _LOOPS):
            head = statement.iter if isinstance(statement, cst.For) else statement.test
            decided = self.unit(head)
            if decided is not None:
                return decided
            inner = self.block(_statements(statement.body))
            if inner & {HIT, STOP}:
                return {STOP}
            return {THROUGH}
        if isinstance(statement, cst.With):
            for item in statement.items:
                decided = self.unit(item.item)
                if decided is not None:
                    return decided
            return self.block(_statements(statement.body))
        if isinstance(statement, (cst.Try, cst.TryStar)):
            outs = self.block(_statements(statement.body))
            if THROUGH in outs and statement.orelse is not None:
                outs = (outs - {THROUGH}) | self.block(_statements(statement.orelse.body))
            if THROUGH in outs and statement.finalbody is not None:
                outs = (outs - {THROUGH}) | self.block(_statements(statement.finalbody.body))
            return outs
        if isinstance(statement, cst.Match):
            outs = {THROUGH}
            for case in statement.cases:
                outs |= self.block(_statements(case.body))
            return outs
        return {THROUGH}
