"""Reads of a local name that some path reaches before any binding: the fix engine's check that
a rewrite did not break a program that still compiles.

A migration moves and removes bindings: it creates the GradScaler where `amp.initialize` was and
passes it to calls, and it removes `from apex import amp`. Put the creation after a call that
passes it, or leave a read of `amp` whose import went, and the program still compiles but raises
`UnboundLocalError` (QG-unilm's `prepare_for_training(..., amp=amp)` was one). This is the
definite-assignment analysis CPython does not do (pylint's `possibly-used-before-assignment`):
per function (and the module's top level), a walk of the statements in order that keeps the
names bound on every path; a read of one of the scope's own names outside that set is reported.

It is path-insensitive (two `if args.fp16:` tests are unrelated to it) and a loop's body may see
names its previous iteration bound, so real code has such reads already. The engine compares
before and after (`introduced`): only a (scope, name) pair that the fix made possibly unbound
counts against it.
"""

from __future__ import annotations

import ast
import builtins
from typing import FrozenSet, Iterable, List, Optional, Set, Tuple

# The state of a path that has left (return, raise, break, continue): every name, for the
# intersection at a join.
_LEFT = None
State = Optional[FrozenSet[str]]


def introduced(old_text: str, new_text: str) -> List[Tuple[str, str]]:
    """(scope, name) pairs possibly unbound at a read in `new_text` and not in `old_text`;
    empty when either does not parse (the compile check judges that)."""
    try:
        old, new = ast.parse(old_text), ast.parse(new_text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    try:
        before, after = possibly_unbound(old), possibly_unbound(new)
    except RecursionError:
        return []
    return sorted(after - before)


def possibly_unbound(tree: ast.Module) -> Set[Tuple[str, str]]:
    """Every (scope, name): a read of the scope's own `name` that some path reaches unbound, or a
    read of a name bound nowhere (no scope around it, no builtin: a `NameError` whenever it runs;
    not judged in a module with a `*` import). The scope is the dotted name of a function
    (`Trainer.fit`, `main.<locals>.step`) or `<module>`."""
    found: Set[Tuple[str, str]] = set()
    star = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(tree))
    module = _Scope("<module>", tree.body, (), found)
    module.free_checked = not star
    module.run()
    return found


def _own_bindings(body: Iterable[ast.stmt], params: Iterable[str]) -> Tuple[Set[str], Set[str]]:
    """(names the scope binds, names it declares global/nonlocal), not looking into nested
    function, class or lambda bodies, nor comprehensions."""
    bound: Set[str] = set(params)
    declared: Set[str] = set()
    stack: List[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            stack.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.extend(d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None)
            else:
                stack.extend(node.bases)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchAs) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        stack.extend(ast.iter_child_nodes(node))
    return bound - declared, declared


def _meet(a: State, b: State) -> State:
    if a is _LEFT:
        return b
    if b is _LEFT:
        return a
    return a & b


_MODULE_NAMES = frozenset(dir(builtins)) | {
    "__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__", "__path__", "__builtins__",
    "__annotations__", "__class__",
}


class _Scope:
    free_checked = False  # whether reads of names bound nowhere are judged (no `*` import)

    def __init__(
        self, name: str, body: List[ast.stmt], params: Tuple[str, ...], found: Set[Tuple[str, str]],
        outer: Optional["_Scope"] = None,
    ) -> None:
        self.name = name
        self.body = body
        self.params = params
        self.found = found
        self.locals, self.declared = _own_bindings(body, params)
        self.outer = outer
        if outer is not None:
            self.free_checked = outer.free_checked

    class_body = False  # a class's body: its methods are named `Class.method`

    def inner(self, name: str) -> str:
        if self.name == "<module>":
            return name
        return f"{self.name}.{name}" if self.class_body else f"{self.name}.<locals>.{name}"

    def run(self) -> None:
        self.block(self.body, frozenset(self.params))

    # ---- statements
    def block(self, statements: List[ast.stmt], state: State) -> State:
        for statement in statements:
            if state is _LEFT:
                return _LEFT  # unreachable code is not judged
            state = self.statement(statement, state)
        return state

    def statement(self, node: ast.stmt, state: FrozenSet[str]) -> State:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for expr in (*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
                self.reads(expr, state)
            args = node.args
            params = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
            params += tuple(a.arg for a in (args.vararg, args.kwarg) if a is not None)
            _Scope(self.inner(node.name), node.body, params, self.found, self.enclosing()).run()
            return state | {node.name}
        if isinstance(node, ast.ClassDef):
            for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                self.reads(expr, state)
            body = _Scope(self.inner(node.name), [], (), self.found, self.enclosing())
            body.class_body = True
            for inner in node.body:  # methods are scopes of their own; the class body is not judged
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    body.statement(inner, frozenset())
            return state | {node.name}
        if isinstance(node, (ast.Return, ast.Raise)):
            for child in ast.iter_child_nodes(node):
                self.reads(child, state)
            return _LEFT
        if isinstance(node, (ast.Break, ast.Continue)):
            return _LEFT
        if isinstance(node, ast.If):
            self.reads(node.test, state)
            return _meet(self.block(node.body, state), self.block(node.orelse, state))
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.reads(node.iter, state)
            inside = self.block(node.body, self.stores(node.target, state))
            # the body may not run; `else:` runs when no `break` left it
            del inside
            return self.block(node.orelse, state) if node.orelse else state
        if isinstance(node, ast.While):
            self.reads(node.test, state)
            self.block(node.body, state)
            if isinstance(node.test, ast.Constant) and node.test.value is True and not node.orelse:
                return _LEFT if not any(isinstance(n, ast.Break) for n in _loop_own(node.body)) else state
            return self.block(node.orelse, state) if node.orelse else state
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.reads(item.context_expr, state)
                if item.optional_vars is not None:
                    state = self.stores(item.optional_vars, state)
            return self.block(node.body, state)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            body = self.block(node.body, state)
            result = self.block(node.orelse, body) if node.orelse else body
            for handler in node.handlers:
                if handler.type is not None:
                    self.reads(handler.type, state)
                entry = state | {handler.name} if handler.name else state
                result = _meet(result, self.block(handler.body, entry))
            if node.finalbody:
                after = self.block(node.finalbody, state)
                if after is _LEFT:
                    return _LEFT
                return after if result is _LEFT else result | after
            return result
        if isinstance(node, ast.Match):
            self.reads(node.subject, state)
            result: State = state  # no case may match
            for case in node.cases:
                entry = state | _pattern_names(case.pattern)
                if case.guard is not None:
                    self.reads(case.guard, entry)
                result = _meet(result, self.block(case.body, entry))
            return result
        if isinstance(node, ast.Assign):
            self.reads(node.value, state)
            for target in node.targets:
                state = self.stores(target, state)
            return state
        if isinstance(node, ast.AugAssign):
            self.reads(node.value, state)
            if isinstance(node.target, ast.Name):
                self.read(node.target.id, state)
                return state | {node.target.id}
            self.reads(node.target, state)
            return state
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.reads(node.value, state)
                return self.stores(node.target, state)
            if not isinstance(node.target, ast.Name):
                self.reads(node.target, state)
            return state
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = {a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"}
            return state | names
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.read(target.id, state)
                    state = state - {target.id}
                else:
                    self.reads(target, state)
            return state
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.Pass)):
            return state
        # Expr, Assert and anything newer: its reads, then whatever it binds (a walrus)
        for child in ast.iter_child_nodes(node):
            self.reads(child, state)
        if isinstance(node, ast.Expr) and _exits(node.value):
            return _LEFT
        return self.walrus_bindings(node, state)

    # ---- expressions
    def stores(self, target: ast.expr, state: FrozenSet[str]) -> FrozenSet[str]:
        if isinstance(target, ast.Name):
            return state | {target.id}
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                state = self.stores(element, state)
            return state
        if isinstance(target, ast.Starred):
            return self.stores(target.value, state)
        self.reads(target, state)  # `x.attr = ...`, `x[i] = ...` read `x`
        return state

    def reads(self, node: ast.AST, state: FrozenSet[str]) -> None:
        stack: List[Tuple[ast.AST, FrozenSet[str]]] = [(node, frozenset())]
        while stack:
            current, shadowed = stack.pop()
            if isinstance(current, ast.Name):
                if isinstance(current.ctx, ast.Load) and current.id not in shadowed:
                    self.read(current.id, state)
                continue
            if isinstance(current, ast.Lambda):
                continue  # runs later, when anything may be bound
            if isinstance(current, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                inner = shadowed | {
                    n.id for g in current.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
                }
                stack.append((current.generators[0].iter, shadowed))
                for index, generator in enumerate(current.generators):
                    if index:
                        stack.append((generator.iter, inner))
                    stack.extend((cond, inner) for cond in generator.ifs)
                elements = [current.key, current.value] if isinstance(current, ast.DictComp) else [current.elt]
                stack.extend((e, inner) for e in elements)
                continue
            stack.extend((child, shadowed) for child in ast.iter_child_nodes(current))

    def read(self, name: str, state: FrozenSet[str]) -> None:
        if name in self.locals and name not in state:
            self.found.add((self.name, name))
        elif name not in self.locals and self.free_checked and not self._bound_around(name):
            self.found.add((self.name, name))

    def enclosing(self) -> "_Scope":
        """The scope a function defined here sees around it: a class body is skipped, as Python
        skips it."""
        return self.outer if self.class_body and self.outer is not None else self

    def _bound_around(self, name: str) -> bool:
        if name in _MODULE_NAMES:
            return True
        scope = self.outer
        while scope is not None:
            if name in scope.locals or name in scope.declared:
                return True
            scope = scope.outer
        return name in self.declared and self.outer is not None  # `global x` bound elsewhere at run time

    def walrus_bindings(self, node: ast.AST, state: FrozenSet[str]) -> FrozenSet[str]:
        names = {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}
        return state | names if names else state


# Calls that never return (as the apex planner's `_init_enclosure._EXITS`), spelled as real code
# spells them; a rebinding of `sys` or `exit` is not followed: this only decides what is compared.
_EXIT_CALLS = frozenset({"sys.exit", "os._exit", "exit", "quit"})


def _exits(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in _EXIT_CALLS
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and f"{func.value.id}.{func.attr}" in _EXIT_CALLS


def _pattern_names(pattern: ast.AST) -> FrozenSet[str]:
    names = set()
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return frozenset(names)


def _loop_own(body: List[ast.stmt]) -> Iterable[ast.AST]:
    """The nodes of a loop body, not those of loops or functions nested in it (their `break`s
    are theirs)."""
    stack: List[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(node.orelse)  # a nested loop's `else:` breaks the outer loop
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
