"""apex's amp module reached through `from X import *` of a module of the run (issue 12).

A common Kaggle layout: `library.py` imports everything a notebook used (`from apex import amp`
among torch, numpy, ...) and each script starts `from library import *`, then calls
`amp.initialize(...)` and `with amp.scale_loss(...)`. The script never names apex, so neither
the name screen nor the resolver sees the module. This module answers, from the index's facts,
which free names of a file its star imports bind to apex's amp module; engine/names.py (the one
resolver) resolves a name bound nowhere in the file to that module (`NameIndex(star_bound=...)`).

The index records, per file, the names it binds at module level by an apex amp import
(`ModuleSummary.apex_star_exports`: `from apex import amp [as x]`, `import apex.amp as x`). For a
file with star imports, `star_bound(index, path)` follows each of them in order, the way Python
binds names: a module of the run (`import_resolution.candidates`; a star import that may load
several files must agree for all of them) exports a name unless its `__all__` leaves it out (or,
without `__all__`, it starts with `_`); its value is the last binding of the name at that
module's top level, star imports of its own included. Precision first, a name is left
unresolved ("unknown") when:
  - a star import of a module outside the run (or one the run cannot resolve) comes after the
    module binding it: it may rebind it;
  - a module of the chain binds it to something else (any other import, assignment, `def`, ...),
    even in one branch (the `amp = None` of an `except` whose `try` imports it aside: apex not
    installed), or assigns it in a function (`global`), or `__all__` is not a literal;
  - a file of the chain changed since the index read it, or does not parse.
The file's own bindings of the name are the resolver's: any binding in scope hides the star.
"""

from __future__ import annotations

import ast
import hashlib
import os
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set, Tuple

from ampmigrate.engine import import_resolution
from ampmigrate.engine.caller_uses import source_tree

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ProjectIndex

APEX_AMP = "apex.amp"

# What a module's top level leaves a name as: one of these, or "=<qualified name>" (the name is
# bound, on every path, by imports of that module: "=apex.amp", "=torch").
ABSENT = "absent"  # not bound (a star import of it leaves the importer's value)
APEX = "=" + APEX_AMP
OTHER = "other"  # something else
DEFINED = "@"  # `@<path>`: the `def` of the module at that path (a helper the index's queries read)
UNKNOWN = "unknown"  # may be something else
# One top-level event of a module, in source order: ("bind", name, the qualified name an import
# binds or "", conditional?) or ("star", dotted module, "", conditional?).
_Event = Tuple[str, str, str, bool]


# ------------------------------------------------------------------------------- index facts
def apex_star_exports(tree: ast.Module) -> List[str]:
    """Names the module binds at its top level (blocks included, not functions or classes) by an
    apex amp import: the candidates `star_bound` follows (ModuleSummary.apex_star_exports)."""
    found: Set[str] = set()
    for statement in _top_statements(tree.body):
        if isinstance(statement, ast.ImportFrom) and statement.module == "apex" and not statement.level:
            found.update(alias.asname or alias.name for alias in statement.names if alias.name == "amp")
        elif isinstance(statement, ast.Import):
            found.update(alias.asname for alias in statement.names if alias.name == APEX_AMP and alias.asname)
    return sorted(found)


def _top_statements(body: List[ast.stmt]):
    """The statements of a module's top level, those of its blocks included, in source order;
    not the bodies of functions and classes."""
    for statement in body:
        yield statement
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _top_statements(getattr(statement, field, None) or [])
        for handler in getattr(statement, "handlers", None) or []:
            yield from _top_statements(handler.body)
        for case in getattr(statement, "cases", None) or []:
            yield from _top_statements(case.body)


# ------------------------------------------------------------------------------- one module
class _Module:
    """The top-level facts of one file that `star_bound` needs, from the tree the index read."""

    def __init__(self, tree: ast.Module, package: str) -> None:
        self.events: List[_Event] = []
        self.all_names: Optional[FrozenSet[str]] = None  # a literal `__all__`
        self.all_dynamic = False  # `__all__` bound to something not a literal list of strings
        self.global_names: Set[str] = set()  # `global x` in some function: bound at call time
        self.loaded: Set[str] = set()  # every name the file reads
        self._walk(tree.body, package, conditional=False)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loaded.add(node.id)
            elif isinstance(node, ast.Global):
                self.global_names.update(node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "__all__":
                self.all_dynamic = True  # `__all__.extend(...)`, `.append(...)`: exports computed

    def _walk(self, body: List[ast.stmt], package: str, conditional: bool) -> None:
        for statement in body:
            self._statement(statement, package, conditional)

    def _statement(self, statement: ast.stmt, package: str, conditional: bool) -> None:
        if isinstance(statement, ast.ImportFrom):
            if any(alias.name == "*" for alias in statement.names):
                module = _absolute(statement.module or "", statement.level, package)
                if module:
                    self.events.append(("star", module, "", conditional))
                else:
                    self.events.append(("star", "", "", conditional))  # unresolvable
                return
            for alias in statement.names:
                qname = f"{statement.module}.{alias.name}" if statement.module and not statement.level else ""
                self._bind(alias.asname or alias.name, qname, conditional)
            return
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                name = alias.asname or alias.name.split(".")[0]
                self._bind(name, alias.name if alias.asname else name, conditional)
            return
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._bind(statement.name, DEFINED, conditional)
            return
        if isinstance(statement, ast.ClassDef):
            self._bind(statement.name, "", conditional)
            return
        if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == "__all__":
                    self._dunder_all(statement)
        # Every other name the statement stores or deletes at this level (targets, `for`,
        # `with ... as`, `except ... as`, walrus, `del`), blocks first walked for their own.
        blocks = [getattr(statement, f, None) or [] for f in ("body", "orelse", "finalbody")]
        handlers = getattr(statement, "handlers", None) or []
        cases = getattr(statement, "cases", None) or []
        for name in _stored_names(statement):
            self._bind(name, "", conditional or bool(blocks[0]))
        inner = conditional or not isinstance(statement, ast.With)  # a `with` body runs once, unless it raises
        if isinstance(statement, ast.Try) or getattr(ast, "TryStar", None) and isinstance(statement, getattr(ast, "TryStar")):
            inner = True
        for block in blocks:
            self._walk(block, package, inner)
        imported = _imported_names(blocks[0]) if handlers else set()
        for handler in handlers:
            if handler.name:
                self._bind(handler.name, "", True)
            for inner_statement in handler.body:
                if not _none_fallback(inner_statement, imported):
                    self._statement(inner_statement, package, True)
        for case in cases:
            self._walk(case.body, package, True)

    def _bind(self, name: str, qname: str, conditional: bool) -> None:
        self.events.append(("bind", name, qname, conditional))

    def _dunder_all(self, statement: ast.stmt) -> None:
        """`__all__ = [...]` (a literal list or tuple of strings) and `__all__ += [...]`; any other
        binding makes the exports unknown."""
        value = getattr(statement, "value", None)
        names: Optional[List[str]] = None
        if isinstance(value, (ast.List, ast.Tuple)):
            names = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) != len(value.elts):
                names = None
        if names is None or (isinstance(statement, ast.AugAssign) and self.all_names is None):
            self.all_dynamic = True
        elif isinstance(statement, ast.AugAssign):
            self.all_names = frozenset(self.all_names or ()) | frozenset(names)
        else:
            self.all_names = frozenset(names)


def _imported_names(body: List[ast.stmt]) -> Set[str]:
    """Names the statements of a `try` body bind by imports (at that level)."""
    return {
        alias.asname or alias.name.split(".")[0]
        for statement in body
        if isinstance(statement, (ast.Import, ast.ImportFrom))
        for alias in statement.names
    }


def _none_fallback(statement: ast.stmt, imported: Set[str]) -> bool:
    """`amp = None` in the `except` of a `try` that imports `amp`: the "not installed" value,
    which the resolver also reads as no binding of its own (engine/names.py: a name denotes the
    union of its bindings, and None denotes nothing). Code reading the name then either checks it
    for None or runs only with apex installed."""
    return (
        isinstance(statement, ast.Assign)
        and all(isinstance(t, ast.Name) and t.id in imported for t in statement.targets)
        and isinstance(statement.value, ast.Constant)
        and statement.value.value is None
    )


def _stored_names(statement: ast.stmt) -> Set[str]:
    """Names a statement binds or deletes in its own scope, not those of its nested blocks,
    functions, classes, lambdas or comprehensions (`x := ...` inside a comprehension included:
    it binds in the enclosing scope)."""
    found: Set[str] = set()
    stack: List[ast.AST] = []
    for field, value in ast.iter_fields(statement):
        if field in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        stack.extend(value if isinstance(value, list) else [value])
    while stack:
        node = stack.pop()
        if not isinstance(node, ast.AST):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.add(node.id)
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.MatchAs) and node.name:
            found.add(node.name)
        elif isinstance(node, ast.MatchStar) and node.name:
            found.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            found.add(node.rest)
        if isinstance(node, ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _absolute(module: str, level: int, package: str) -> str:
    if not level:
        return module
    parts = package.split(".") if package else []
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, *([module] if module else [])])


# ------------------------------------------------------------------------------- queries
def _state(index: "ProjectIndex") -> Dict[str, object]:
    return index.__dict__.setdefault("_apex_star", {"names": None, "modules": {}, "bound": {}, "exported": {}})


def candidate_names(index: "ProjectIndex") -> FrozenSet[str]:
    """Every name some module of the run binds at top level by an apex amp import."""
    state = _state(index)
    if state["names"] is None:
        state["names"] = frozenset(n for s in index.modules.values() for n in getattr(s, "apex_star_exports", ()))
    return state["names"]  # type: ignore[return-value]


def _module(index: "ProjectIndex", path: str) -> Optional[_Module]:
    modules = _state(index)["modules"]
    if path not in modules:
        tree = source_tree(index, path)
        try:
            modules[path] = _Module(tree, index.package_of(path)) if tree is not None else None
        except RecursionError:
            modules[path] = None
    return modules[path]  # type: ignore[return-value]


def _exported(index: "ProjectIndex", path: str, name: str, active: Set[str], seen: Set[str]) -> str:
    """What `from <the module at path> import *` binds `name` to (ABSENT: leaves it); the files
    read on the way go to `seen`."""
    memo = _state(index)["exported"]
    key = (path, name)
    if key in memo:
        result, read = memo[key]
        seen.update(read)
        return result
    if path in active:
        return UNKNOWN  # a cycle of star imports: Python sees a module half run
    local: Set[str] = {path}
    module = _module(index, path)
    if module is None or module.all_dynamic:
        result = UNKNOWN
    elif module.all_names is not None and name not in module.all_names:
        result = ABSENT
    elif module.all_names is None and name.startswith("_"):
        result = ABSENT
    else:
        result = _run(index, path, module, name, active | {path}, local, own_bindings=True)
    memo[key] = (result, frozenset(local))
    seen.update(local)
    return result


def _run(index: "ProjectIndex", path: str, module: _Module, name: str, active: Set[str], seen: Set[str], own_bindings: bool) -> str:
    """The value of `name` after the module's top level runs (its own bindings counted only when
    `own_bindings`: the checked file's are the resolver's)."""
    if name in module.global_names:
        return UNKNOWN
    state = ABSENT
    for kind, value, qname, conditional in module.events:
        if kind == "bind":
            if value != name:
                continue
            if not own_bindings:
                return ABSENT  # the file binds it itself: the resolver's binding, never the star
            new = DEFINED + path if qname == DEFINED else "=" + qname if qname else OTHER
        else:
            new = _star(index, path, value, name, active, seen)
            if new == ABSENT:
                continue
        state = new if not conditional or state in (ABSENT, new) else UNKNOWN
    return state


def _star(index: "ProjectIndex", importer: str, dotted: str, name: str, active: Set[str], seen: Set[str]) -> str:
    found = import_resolution.candidates(index, importer, dotted) if dotted else []
    if not found:
        return UNKNOWN  # a module outside the run (or one the index cannot name): may bind anything
    results = {_exported(index, other, name, active, seen) for other in found}
    return results.pop() if len(results) == 1 else UNKNOWN


def star_bound(index: "ProjectIndex", path: str) -> Dict[str, str]:
    """{name: "apex.amp"} for the names the star imports of the file at `path` bind to apex's amp
    module (the file's own bindings aside: the resolver's)."""
    return dict(_bound(index, os.path.abspath(path))[0])


def star_key(index: "ProjectIndex", path: str) -> str:
    """The cache-key part of `star_bound`: the digests of every file it read."""
    bound, seen = _bound(index, os.path.abspath(path))
    if not seen:
        return ""
    parts = [f"{p}={index.digests.get(p, '')}" for p in sorted(seen)] + [f"{n}={q}" for n, q in bound]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()


def _bound(index: "ProjectIndex", path: str) -> Tuple[Tuple[Tuple[str, str], ...], FrozenSet[str]]:
    memo = _state(index)["bound"]
    if path in memo:
        return memo[path]  # type: ignore[return-value]
    summary = index.modules.get(path)
    names = candidate_names(index)
    helpers = helper_names(index)
    answer: Tuple[Tuple[Tuple[str, str], ...], FrozenSet[str]] = ((), frozenset())
    if summary is not None and summary.star_imports and (names or helpers):
        module = _module(index, path)
        if module is not None:
            seen: Set[str] = set()
            bound = []
            # Helpers of other files the queries read (a checkpoint loader, a clip helper) that
            # the star imports bring: `from src.utils import *` then `restart_from_checkpoint(...)`.
            for name in sorted((module.loaded & helpers) - names):
                value = _run(index, path, module, name, {path}, seen, own_bindings=False)
                qualified = _spelled(index, path, value[len(DEFINED):], name) if value.startswith(DEFINED) else None
                if qualified:
                    bound.append((name, qualified))
            for name in sorted(names):
                if _run(index, path, module, name, {path}, seen, own_bindings=False) == APEX:
                    bound.append((name, APEX_AMP))
            if any(q == APEX_AMP for _, q in bound) or summary.apex_star_exports or summary.apex_initializes:
                # The file's other free names too, where the chain binds them by imports
                # (`torch`, `nn`, `F`), when apex's amp comes through the chain or the file imports
                # it itself (`from apex import amp` beside `from util import *`, at the top or in the
                # function calling `amp.initialize`): the migration must
                # see `nn.utils.clip_grad_norm_` as the clip it is, and spell torch through the
                # name the file already has.
                for name in sorted(module.loaded - names - {n for n, _ in bound}):
                    value = _run(index, path, module, name, {path}, seen, own_bindings=False)
                    if value.startswith("="):
                        bound.append((name, value[1:]))
            answer = (tuple(bound), frozenset(seen | {path}))
    memo[path] = answer
    return answer


def helper_names(index: "ProjectIndex") -> FrozenSet[str]:
    """Every name some module of the run defines as a helper the index's queries read."""
    state = _state(index)
    if state.get("helpers") is None:
        from ampmigrate.engine.project_index import HELPER_RECORDS

        state["helpers"] = frozenset(
            name for summary in index.modules.values() for field in HELPER_RECORDS for name in getattr(summary, field)
        )
    return state["helpers"]  # type: ignore[return-value]


def _spelled(index: "ProjectIndex", importer: str, path: str, name: str) -> Optional[str]:
    """`name` of the module at `path` as a qualified name that, read from `importer`, names that
    file again: its dotted name from the run's root, else the longest that does."""
    for dotted in index.module_names(path):
        if dotted.split(".")[0] in ("torch", "apex"):
            continue  # never mistaken for the libraries the rules look for
        if import_resolution.candidates(index, importer, dotted) == [path]:
            return f"{dotted}.{name}"
    return None


def provider_key(index: "ProjectIndex", path: str) -> str:
    """The cache-key part of a provider's fix (rules/apex/_star_users.py plans every file whose
    star imports reach it): the digests of those files and of what they read."""
    absolute = os.path.abspath(path)
    summary = index.modules.get(absolute)
    if summary is None or not summary.apex_star_exports:
        return ""
    users = _state(index).setdefault("users", None)
    if users is None:
        users = {}
        for other, facts in sorted(index.modules.items()):
            if facts.star_imports:
                for reached_path in _bound(index, other)[1]:
                    users.setdefault(reached_path, []).append(other)
        _state(index)["users"] = users
    parts = []
    for other in users.get(absolute, ()):
        if other != absolute:
            parts.extend(f"{p}={index.digests.get(p, '')}" for p in sorted(_bound(index, other)[1]))
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest() if parts else ""


def reached(index: "ProjectIndex", path: str) -> FrozenSet[str]:
    """The files of the run the star imports of `path` were followed into (itself included)."""
    return _bound(index, os.path.abspath(path))[1]


def star_providers(index: "ProjectIndex", path: str) -> List[str]:
    """The files of the run whose top-level apex amp import the star imports of `path` reach."""
    _, seen = _bound(index, os.path.abspath(path))
    names = candidate_names(index)
    return sorted(
        p for p in seen if set(getattr(index.modules.get(p), "apex_star_exports", ()) or ()) & names and p != os.path.abspath(path)
    )
