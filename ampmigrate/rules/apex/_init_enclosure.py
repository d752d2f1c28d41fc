"""`amp.initialize` inside a `try` or a loop: when the GradScaler made where it was keeps apex's
semantics (issue 12).

apex keeps one global amp state. Each `amp.initialize` call builds new loss scalers
(apex/amp/_initialize.py) and patches the optimizers it is given; a second call with an optimizer
it already patched raises `RuntimeError("A given optimizer should only be passed through
amp.initialize once.")`. The migration makes the GradScaler where the call was (or before the
`if`s around it, with their test as `enabled=`: `_scaler_access._plan_enabled`). Two enclosures
of the call are followed here:

- a `try` holding the call in its body or its `else:`, whose every handler leaves (returns,
  raises, exits through `sys.exit()`/`exit()`/`os._exit()`, or `continue`s/`break`s the loop
  around the `try`): code after the `try` runs only when the call ran, so the call is as good as
  straight-line code there. A handler that falls through lets later code run without it: the
  uses of the scaler must then all be inside the `try`;
- a setup loop (`for i in range(len(models)): models[i], optimizers[i] = amp.initialize(...)`,
  the scaler made before the `if` around the loop): apex's last call made the loss scalers that
  all later training used, so one GradScaler serves it, when no use of it runs inside the loop;
- a loop body (`for fold in folds: model = ...; optimizer = ...; model, optimizer =
  amp.initialize(model, optimizer); for epoch ...: train_one_epoch(...)`): every iteration's call
  made new loss scalers, so a new GradScaler at the same place in each iteration is what apex did,
  when every use of the scaler is reached only after the call in the same iteration, the
  optimizer is made anew (by a call) in the iteration before the call (apex raised at the second
  iteration otherwise), the scaler is made inside the loop (not hoisted before it), and the `if`s its
  `enabled=` comes from test nothing the loop changes (`if epoch == start:` would leave later
  iterations the scaler an earlier one made).

A use is every statement the fix writes that spells the scaler (the scaled backward, the step,
`unscale_`, its state, the calls that pass it on) and each call of a function of this file that
reads it as a global. Each must come after `amp.initialize` in program order: below the `try`s
and loops around the call that do not hold the use, only `if`s that became the scaler's
`enabled=` and `with` blocks may lie, and the use follows the call in their common block (or is
in the `else:` of the `try` whose body calls it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator, List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import body_of, preceding, walk
from ampmigrate.rules.apex._amp_common import Unfixable

if TYPE_CHECKING:
    from ampmigrate.analysis.statements import Branch
    from ampmigrate.rules.apex._scaler_access import ScalerAccess

_LOOPS = (cst.For, cst.While)
# What may lie between `amp.initialize` and a later use: blocks, `with`, the `if`s the scaler's
# `enabled=` comes from, `try`s whose handlers leave (each checked in `_check_after`).
_ORDERED = (cst.IndentedBlock, cst.SimpleStatementSuite, cst.SimpleStatementLine, cst.Else, cst.If, cst.Try, cst.With)
_EXITS = frozenset({"sys.exit", "os._exit", "builtins.exit", "builtins.quit"})


def enclosures(access: "ScalerAccess", stop: cst.CSTNode) -> List[cst.CSTNode]:
    """The loops and `try`s around `amp.initialize` below `stop` (its function), innermost first;
    Unfixable where the call sits somewhere no order can be proven (a handler, a `finally:`, a
    loop's `else:`)."""
    planner = access.p
    found: List[cst.CSTNode] = []
    child: cst.CSTNode = planner.init_line
    for ancestor in access.names.ancestors(planner.init_line):
        if ancestor is stop:
            break
        line = planner._line(ancestor)
        if isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)):
            raise Unfixable(
                f"`amp.initialize` runs in an `except` handler (line {line}): whether it ran where the scaler is used is unclear"
            )
        if isinstance(ancestor, cst.Finally):
            raise Unfixable(f"`amp.initialize` runs in a `finally:` block (line {line}), also after an exception")
        if isinstance(ancestor, cst.TryStar):
            raise Unfixable(f"`amp.initialize` runs inside a `try` with `except*` (line {line})")
        if isinstance(ancestor, _LOOPS):
            if child is not ancestor.body:
                raise Unfixable(f"`amp.initialize` runs in the `else:` of the loop at line {line}")
            found.append(ancestor)
        elif isinstance(ancestor, cst.Try):
            found.append(ancestor)
        child = ancestor
    return found


class InitEnclosure:
    """The loops and `try`s around `amp.initialize` (see the module docstring): the checks of
    where the scaler is made (when the access is planned) and of its uses (when the fix is)."""

    def __init__(self, access: "ScalerAccess", found: List[cst.CSTNode], conditions: List["Branch"]) -> None:
        self.access = access
        self.p = access.p
        self.names = access.names
        self.found = found
        self.loops = [n for n in found if isinstance(n, _LOOPS)]
        self.conditions = conditions
        self.setup_loops: List[cst.CSTNode] = []  # loops the scaler is made before (see _check_creation)
        self._check_access()
        self._check_creation()
        for loop in self.loops:
            self._check_conditions(loop)
        if self.loops and not self.setup_loops:
            self._check_fresh_optimizers(self.loops[0])

    # ---- when the access is planned
    def _what(self) -> str:
        kinds = {"loop" if isinstance(n, _LOOPS) else "`try`" for n in self.found}
        return " and a ".join(sorted(kinds))

    def _check_access(self) -> None:
        access = self.access
        if self._attribute_per_iteration():
            return
        if access.mode != "local" or getattr(access, "detached_init", None) is not None or hasattr(access, "constructions"):
            raise Unfixable(
                f"`amp.initialize` runs inside a {self._what()}, and the scaler would live on an object whose methods "
                "may run apart from it"
            )

    def _attribute_per_iteration(self) -> bool:
        """`self.scaler` made at each iteration of the loops around `amp.initialize` in a method
        (intra_batch's hyperparameter search: a new optimizer, `amp.initialize`, then
        `self.execute()` trains): apex's loss scalers were global and the last call's, as the
        attribute is the last one assigned, whichever method reads it and when; before the first
        call the disabled default of `__init__` is apex not yet set up. Only loops (a `try` may
        fall through), with the scaler made inside every one of them."""
        access = self.access
        if access.mode != "attribute" or getattr(access, "detached_init", None) is not None or hasattr(access, "constructions"):
            return False
        if getattr(access, "default_init", None) is None or len(self.loops) != len(self.found):
            return False
        creation = self.creation_point()
        return all(self._inside(creation, loop.body) for loop in self.loops)

    def creation_point(self) -> cst.CSTNode:
        return self.access.hoist_before if self.access.hoist_before is not None else self.p.init_line

    def _check_creation(self) -> None:
        """A loop the scaler is made before (its `if` is outside the loop) is a setup loop, as
        `for i in range(len(models)): models[i], optimizers[i] = amp.initialize(models[i],
        optimizers[i])`: one scaler is right only if no use runs in it (`_check_after`), since
        then every later use saw the loss scaler of apex's last call, one scaler for all."""
        creation = self.creation_point()
        for loop in self.loops:
            if not self._inside(creation, loop.body):
                if any(self._inside(loop, other.body) for other in self.loops if other is not loop):
                    raise Unfixable(self._made_before(loop, creation))
                self.setup_loops.append(loop)

    def _made_before(self, loop: cst.CSTNode, creation: cst.CSTNode) -> str:
        return (
            f"`amp.initialize` runs at each iteration of the loop at line {self.p._line(loop)}, under the `if` "
            f"at line {self.p._line(creation)} outside it: the scaler would be made once before the loop, "
            "where apex made new loss scalers at each call"
        )

    def _check_conditions(self, loop: cst.CSTNode) -> None:
        """An `if` inside the loop that gives the scaler's `enabled=` must test the same in every
        iteration: otherwise the call runs in some iterations only, and the others used the loss
        scaler an earlier one made (the migrated scaler would be disabled there)."""
        stores: Optional[Set[str]] = None
        for branch in self.conditions:
            if not self._inside(branch.statement, loop.body):
                continue
            if stores is None:
                stores = stores_in(loop)
            for read in reads_of(branch.test):
                if any(read == s or read.startswith(s + ".") or s.startswith(read + ".") for s in stores):
                    raise Unfixable(
                        f"`amp.initialize` runs under `if {self.p.ctx.code(branch.test).strip()}` (line "
                        f"{self.p._line(branch.statement)}), and the loop at line {self.p._line(loop)} changes "
                        f"`{read}`: later iterations would use the scaler an earlier one made"
                    )

    def _check_fresh_optimizers(self, loop: cst.CSTNode) -> None:
        """Each iteration must hand `amp.initialize` a new optimizer: apex raised at the second call
        with one it had already patched."""
        optimizers = self.access.p.spec.optimizers
        if optimizers is None:
            return
        elements = [e.value for e in optimizers.elements] if isinstance(optimizers, (cst.List, cst.Tuple)) else [optimizers]
        made: Set[str] = set()
        for statement in preceding(self.names, self.p.init_line):
            made |= _made_by_calls(statement)
            if isinstance(statement, cst.If):
                made |= self._made_by_chain_without_else(statement, loop)
        for optimizer in elements:
            if isinstance(optimizer, cst.Call):
                continue  # `amp.initialize(model, Adam(...))`: a new one each time
            dotted = _dotted(optimizer)
            if dotted is None or dotted not in made:
                raise Unfixable(
                    f"`amp.initialize` runs at each iteration of the loop at line {self.p._line(loop)} with an optimizer "
                    f"(`{self.p.ctx.code(optimizer).strip()}`) not made anew in the iteration before it: apex raised "
                    "RuntimeError ('A given optimizer should only be passed through amp.initialize once') at the second"
                )

    def _made_by_chain_without_else(self, top: cst.If, loop: cst.CSTNode) -> Set[str]:
        """`if args.optm == "SGD": optimizer = SGD(...)` `elif args.optm == "Adam": optimizer =
        Adam(...)`, no `else` (a k-fold loop's choice): the names every arm binds to a new object,
        where the tests read nothing the loop changes (every iteration takes the arm the first one
        took) and the chain holds every binding of the name in the function but `amp.initialize`'s
        own (had no arm run, the first iteration would have stopped with a NameError there)."""
        links, arms = [top], [top.body]
        while isinstance(links[-1].orelse, cst.If):
            links.append(links[-1].orelse)
            arms.append(links[-1].body)
        if links[-1].orelse is not None or not all(isinstance(arm, cst.IndentedBlock) for arm in arms):
            return set()
        stored = stores_in(loop)
        for link in links:
            for read in reads_of(link.test):
                if any(read == s or read.startswith(s + ".") or s.startswith(read + ".") for s in stored):
                    return set()
        sets = [set().union(*(_made_by_calls(s) for s in arm.body)) for arm in arms if not _raises_at_end(arm)]
        if not sets:
            return set()
        scope = self.p._function_scope(top)
        return {
            name for name in set.intersection(*sets)
            if "." not in name and name not in scope.global_names and name not in scope.nonlocal_names
            and scope.bindings.get(name)
            and all(self._inside(b.node, top) or self._inside(b.node, self.p.init_line) for b in scope.bindings[name])
        }

    # ---- when the fix is planned
    def check_uses(self) -> None:
        """Every use of the scaler the fix writes runs after `amp.initialize` (see the module
        docstring), and none inside a setup loop."""
        for use in self._uses():
            for loop in self.setup_loops:
                if self._inside(use, loop):
                    raise Unfixable(self._made_before(loop, self.creation_point()))
            self._check_after(use)

    def _uses(self) -> Iterator[cst.CSTNode]:
        builder = self.p.builder
        pattern = re.compile(rf"(?<![\w.]){re.escape(self.access.name)}\b")  # the local scaler, not `x.scaler`
        creation = getattr(self.p, "hoisted", None)
        created = creation[1] if creation is not None else None
        init_line = self.p.init_line
        home = self.access.home
        seen: Set[int] = set()
        for target in builder.targets():
            if target is init_line or isinstance(target, cst.Parameters) or self._inside(init_line, target):
                continue
            if not self._spells(builder, target, pattern, created):
                continue
            scope = self.p._function_scope(target)
            if scope is home:
                points = [target]
            else:
                points = self._home_calls(scope, ())
            for point in points:
                if id(point) not in seen:
                    seen.add(id(point))
                    yield point

    def _spells(self, builder, target: cst.CSTNode, pattern: "re.Pattern[str]", created) -> bool:
        new: List[object] = []
        if builder.replaces(target):
            new.append(builder.replacement(target))
        new.extend(s for s in builder._before.get(target, ()) if s is not created)
        new.extend(builder._after.get(target, ()))
        for item in new:
            if callable(item):
                return True  # rebuilt from the updated node: assume it spells the scaler
            nodes = list(item.nodes) if isinstance(item, cst.FlattenSentinel) else [item]
            for node in nodes:
                if isinstance(node, cst.CSTNode) and pattern.search(self.p.module.code_for_node(node)):
                    return True
        return False

    def _home_calls(self, scope, visiting: tuple) -> List[cst.CSTNode]:
        """Where the home function (module) runs `scope`, a function of this file using the scaler:
        every reference must be a call, from home or from such a function."""
        home = self.access.home
        name = getattr(scope.node, "name", None)
        label = f"`{name.value}()`" if isinstance(name, cst.Name) else "a function"
        module = self.names.module_scope
        if scope in visiting or len(visiting) > 4 or scope.kind != "function" or scope.parent is not module:
            raise Unfixable(
                f"`amp.initialize` runs inside a {self._what()}, and {label} uses the scaler where the order of the "
                "two cannot be followed"
            )
        binding = self.access._def_binding(scope)
        refs = self.names.references(binding) if binding is not None else []
        if binding is None or len(module.bindings.get(binding.name, [])) != 1 or not refs:
            raise Unfixable(
                f"`amp.initialize` runs inside a {self._what()}, and {label} uses the scaler but is not only called here"
            )
        points: List[cst.CSTNode] = []
        for ref in refs:
            call = self.names.parent(ref)
            if not (isinstance(call, cst.Call) and call.func is ref):
                raise Unfixable(
                    f"`amp.initialize` runs inside a {self._what()}, and {label} uses the scaler but is used as a value "
                    f"at line {self.p._line(ref)}"
                )
            caller = self.p._function_scope(call)
            points.extend([call] if caller is home else self._home_calls(caller, (*visiting, scope)))
        return points

    def _check_after(self, use: cst.CSTNode) -> None:
        """`use` runs after `amp.initialize` in the same iteration (see the module docstring)."""
        init_line = self.p.init_line
        creation = self.creation_point()
        above_use = {id(n) for n in self.names.ancestors(use)}
        above_use.add(id(use))
        init_at, use_at = self.p._line(init_line), self.p._line(use)
        child: cst.CSTNode = init_line
        below_creation = creation is not init_line
        for ancestor in self.names.ancestors(init_line):
            if id(ancestor) in above_use:
                break
            if isinstance(ancestor, _LOOPS) and ancestor not in self.setup_loops:
                raise Unfixable(
                    f"line {use_at} uses the scaler after the loop at line {self.p._line(ancestor)}, each iteration of "
                    f"which calls `amp.initialize` (line {init_at}): apex's loss scaler there was the last call's"
                )
            if isinstance(ancestor, cst.If) and not below_creation:
                raise Unfixable(
                    f"`amp.initialize` (line {init_at}) runs under the `if` at line {self.p._line(ancestor)}, and line "
                    f"{use_at} uses the scaler outside it"
                )
            if isinstance(ancestor, cst.Try) and child is not ancestor.finalbody:
                handler = next((h for h in ancestor.handlers if not _leaves(self.names, h.body)), None)
                if handler is not None:
                    raise Unfixable(
                        f"the `except` at line {self.p._line(handler)} falls through, so line {use_at}, after the `try`, "
                        f"may use the scaler without `amp.initialize` (line {init_at}) having run"
                    )
            if not isinstance(ancestor, _ORDERED) and ancestor not in self.setup_loops:  # a `match` case: maybe not run
                raise Unfixable(
                    f"`amp.initialize` (line {init_at}) runs inside a `{type(ancestor).__name__}` at line "
                    f"{self.p._line(ancestor)}, and line {use_at} uses the scaler outside it"
                )
            if ancestor is creation:
                below_creation = False  # the `if`s above the one the scaler is made before are not its conditions
            child = ancestor
        else:  # pragma: no cover - the module holds both
            return
        common = ancestor
        use_child = use
        for node in self.names.ancestors(use):
            if node is common:
                break
            use_child = node
        if use is common:
            return  # `use` holds the call (a statement rebuilt around it): its parts are checked on their own
        body = body_of(common)
        if body is not None:
            index = {id(s): i for i, s in enumerate(body)}
            if index.get(id(use_child), -1) > index.get(id(child), len(body)):
                return
            raise Unfixable(f"line {use_at} uses the scaler before `amp.initialize` (line {init_at}) has run")
        if isinstance(common, cst.Try) and child is common.body and isinstance(common.orelse, cst.Else) and use_child is common.orelse:
            return
        raise Unfixable(f"line {use_at} uses the scaler where `amp.initialize` (line {init_at}) has not run")

    # ---- helpers
    def _inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return node is container or any(a is container for a in self.names.ancestors(node))


def _dotted(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a name or attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr.value}" if inner is not None else None
    return None


def reads_of(test: cst.CSTNode) -> Set[str]:
    """The names and attribute chains a (pure) test reads, longest chains only."""
    found: Set[str] = set()
    inner: Set[int] = set()
    for node in walk(test):
        if id(node) in inner:
            continue
        dotted = _dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if dotted is not None:
            found.add(dotted)
            inner.update(id(n) for n in walk(node))
    return found


def _assigned(small: cst.CSTNode) -> List[cst.CSTNode]:
    """The target expressions a small statement stores to (tuples flattened)."""
    targets: List[cst.CSTNode] = []
    if isinstance(small, cst.Assign):
        targets = [t.target for t in small.targets]
    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
        targets = [small.target]
    return list(_flatten(targets))


def _flatten(targets) -> Iterator[cst.CSTNode]:
    for target in targets:
        if isinstance(target, (cst.Tuple, cst.List)):
            yield from _flatten(e.value for e in target.elements)
        elif isinstance(target, cst.StarredElement):
            yield from _flatten([target.value])
        else:
            yield target


def _made_by_calls(statement: cst.CSTNode) -> Set[str]:
    """Names and attribute chains the statement surely binds to a new object, one a call returns
    (`optimizer = self.optimizer` is the old one): in an `if`, those every arm binds (an `else`
    needed), where an arm that ends in `raise` (`else: raise NotImplementedError`) binds
    whatever the others do, since nothing after the `if` runs after it."""
    made: Set[str] = set()
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and isinstance(small.value, cst.Call):
                made.update(d for d in map(_dotted, _assigned(small)) if d is not None)
    elif isinstance(statement, cst.If) and statement.orelse is not None:
        arms = [statement.body, statement.orelse.body if isinstance(statement.orelse, cst.Else) else None]
        sets = []
        for arm in arms:
            if arm is None:  # an `elif`: its own arms
                sets.append(_made_by_calls(statement.orelse))
            elif isinstance(arm, cst.IndentedBlock):
                if not _raises_at_end(arm):
                    sets.append(set().union(*(_made_by_calls(s) for s in arm.body)))
            else:
                return made
        made = set.intersection(*sets) if sets else made
    return made


def _raises_at_end(block: cst.IndentedBlock) -> bool:
    last = block.body[-1] if block.body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Raise)


def stores_in(loop: cst.CSTNode) -> Set[str]:
    """Every name or attribute chain written inside `loop` (its own target included): the
    subscript `a.b[k] = v` writes into `a.b`."""
    written: List[cst.CSTNode] = []
    for node in walk(loop):
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            written.extend(_assigned(node))
        elif isinstance(node, (cst.For, cst.CompFor)):
            written.extend(_flatten([node.target]))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            written.extend(_flatten([node.asname.name]))
        elif isinstance(node, cst.NamedExpr):
            written.append(node.target)
        elif isinstance(node, cst.Del):
            written.extend(_flatten([node.target]))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not loop:
            written.append(node.name)
        elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                while isinstance(bound, cst.Attribute):
                    bound = bound.value
                written.append(bound)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            written.extend(item.name for item in node.names)
    found: Set[str] = set()
    for target in written:
        while isinstance(target, cst.Subscript):
            target = target.value
        dotted = _dotted(target)
        if dotted is not None:
            found.add(dotted)
    return found


def _leaves(names, block: cst.BaseSuite) -> bool:
    """Every path through the block leaves it for good: a `return`, `raise`, `continue` or
    `break` (of the loop around the `try`), or an exit call, reached on every path."""
    if isinstance(block, cst.SimpleStatementSuite):
        return any(_small_leaves(names, s) for s in block.body)
    return any(_statement_leaves(names, s) for s in block.body)


def _small_leaves(names, small: cst.CSTNode) -> bool:
    if isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
        return True
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        if isinstance(func, cst.Name) and func.value in ("exit", "quit") and not names.bindings_of(func):
            return True
        return bool(names.qualified_names(func) & _EXITS)
    return False


def _statement_leaves(names, statement: cst.CSTNode) -> bool:
    if isinstance(statement, cst.SimpleStatementLine):
        return any(_small_leaves(names, s) for s in statement.body)
    if isinstance(statement, cst.If):
        orelse = statement.orelse
        if orelse is None:
            return False
        other = _statement_leaves(names, orelse) if isinstance(orelse, cst.If) else _leaves(names, orelse.body)
        return _leaves(names, statement.body) and other
    if isinstance(statement, cst.With):
        return _leaves(names, statement.body)
    if isinstance(statement, cst.Try):
        if statement.finalbody is not None and _leaves(names, statement.finalbody.body):
            return True
        return _leaves(names, statement.body) and all(_leaves(names, h.body) for h in statement.handlers)
    return False
