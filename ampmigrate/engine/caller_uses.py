"""How a file of the run uses one function of another file, however it imports it.

The project index knows who may import whom (engine/import_resolution.py) from cheap byte scans;
a threaded apex helper (engine/apex_checkpoint.py) must know every call of it: `from utils import
save_checkpoint` then `save_checkpoint(...)`, `import utils` then `utils.save_checkpoint(...)`,
`from . import utils`, `import pkg.utils as U` then `U.save_checkpoint(...)`, `from utils import *`.
Only the few files that import the helper's module are read again here, with `ast`, when a
decision needs them (their bytes must still have the digest the index read, else nothing is
known), and what is found is kept on the index.

`uses(index, importer, target, function)` gives the spellings of the function in the importer, its
calls (line, positional count, keywords, whether arguments are unpacked), its other uses (a value
handed on), and whether the module object itself escapes (passed, stored: its attributes may be
called anywhere) or a star-imported name is bound again in the file. `binds(signature, call)` says
whether a call can bind to the function's parameters at all: a call that cannot raises `TypeError`
before reaching the function's body, with or without an added parameter.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Tuple

from ampmigrate.engine.import_resolution import candidates, importers
from ampmigrate.source import SourceError, read_regular_file

if TYPE_CHECKING:
    from ampmigrate.engine.import_resolution import Importing
    from ampmigrate.engine.project_index import ProjectIndex


@dataclass(frozen=True)
class Call:
    line: int
    positional: int
    keywords: FrozenSet[str]
    unpacks: bool


@dataclass(frozen=True)
class Uses:
    spellings: FrozenSet[str]  # `save_checkpoint`, `utils.save_checkpoint`, `U.save_checkpoint`
    calls: Tuple[Call, ...]
    other: int  # uses that are not calls
    escapes: str  # the module object used otherwise than for an attribute: as spelled, or ""
    rebound: bool  # a name `*` brings is bound again by the file (which binding a call sees is unsure)
    shadowed: bool  # ... by a top-level `def` that every call (inside a function) sees instead


@dataclass(frozen=True)
class Signature:
    positional: Tuple[str, ...]
    required: int  # positional parameters without a default
    kwonly: Tuple[str, ...]
    kwonly_required: Tuple[str, ...]
    varargs: bool
    varkw: bool


def source_tree(index: "ProjectIndex", path: str) -> Optional[ast.Module]:
    """The file as the index read it, parsed (None: changed since, unreadable, or no parse)."""
    memo = index.__dict__.setdefault("_caller_trees", {})
    if path in memo:
        return memo[path]
    tree = None
    source = index.apex_sources.get(path)
    raw = source[1] if source is not None else None
    if raw is None:
        try:
            raw = read_regular_file(path, None)
        except (SourceError, OSError):
            raw = None
        if raw is not None and hashlib.blake2b(raw, digest_size=16).hexdigest() != index.digests.get(path):
            raw = None
    if raw is not None:
        try:
            tree = ast.parse(raw)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            tree = None
    memo[path] = tree
    return tree


def signature(index: "ProjectIndex", path: str, function: str) -> Optional[Signature]:
    """The parameters of the last top-level `def function` of the file at `path` (the one bound at run time)."""
    tree = source_tree(index, path)
    if tree is None:
        return None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not defs:
        return None
    args = defs[-1].args
    positional = tuple(a.arg for a in [*args.posonlyargs, *args.args])
    kwonly = tuple(a.arg for a in args.kwonlyargs)
    return Signature(
        positional,
        len(positional) - len(args.defaults),
        kwonly,
        tuple(a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None),
        args.vararg is not None,
        args.kwarg is not None,
    )


def binds(sig: Signature, call: Call, added: str) -> bool:
    """Whether `call` may bind to `sig` (unpacked arguments may). False only where it raises
    `TypeError` both before and after the parameter `added` joins the signature: a required
    argument missing, or a keyword the function has not (and that is not `added`)."""
    if call.unpacks:
        return True
    given = set(sig.positional[: call.positional]) | set(call.keywords)
    if any(p not in given for p in sig.positional[: sig.required]) or any(k not in given for k in sig.kwonly_required):
        return False
    names = set(sig.positional) | set(sig.kwonly) | {added}
    if not sig.varkw and any(k not in names for k in call.keywords):
        return False
    return True


def dotted(node: ast.AST) -> str:
    """`name` or `a.b.name` as written; "" for any other expression."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def _absolute(index: "ProjectIndex", importer: str, node: ast.ImportFrom) -> str:
    module = node.module or ""
    if not node.level:
        return module
    parts = index.package_of(importer).split(".") if index.package_of(importer) else []
    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join([*parts, *([module] if module else [])])


def uses(index: "ProjectIndex", importer: str, target: str, function: str) -> Optional[Uses]:
    """How the file `importer` uses `function` of the module at `target` (None: not readable)."""
    memo = index.__dict__.setdefault("_caller_uses", {})
    key = (importer, target, function)
    if key not in memo:
        memo[key] = _uses(index, importer, target, function)
    return memo[key]


def _uses(index: "ProjectIndex", importer: str, target: str, function: str) -> Optional[Uses]:
    tree = source_tree(index, importer)
    if tree is None:
        return None

    def names_target(dotted: str) -> bool:
        return candidates(index, importer, dotted) == [target]

    names: set = set()  # local names bound to the function
    modules: set = set()  # spellings of the module object
    star = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(index, importer, node)
            for alias in node.names:
                if alias.name == "*":
                    star = star or names_target(module)
                elif alias.name == function and names_target(module):
                    names.add(alias.asname or alias.name)
                elif module and names_target(f"{module}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if names_target(alias.name):
                    modules.add(alias.asname or alias.name)
    rebound = shadowed = False
    if star:
        bound_here = _bindings(tree, function)
        if not bound_here:
            names.add(function)
        elif bound_here == ["def"] and not any(
            isinstance(n, ast.Name) and n.id == function for n in _top_level_nodes(tree)
        ):
            shadowed = True  # a top-level `def`, used only inside functions: the calls see it
        else:
            rebound = True
    parents: Dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    spellings = set(names) | {f"{m}.{function}" for m in modules}
    calls: List[Call] = []
    other = 0
    escapes = ""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(getattr(node, "ctx", None), ast.Load):
            continue
        spelled = dotted(node)
        if not spelled:
            continue
        parent = parents.get(id(node))
        if spelled in spellings:
            if isinstance(parent, ast.Call) and parent.func is node:
                calls.append(
                    Call(
                        node.lineno,
                        len(parent.args),
                        frozenset(k.arg for k in parent.keywords if k.arg),
                        any(isinstance(a, ast.Starred) for a in parent.args) or any(k.arg is None for k in parent.keywords),
                    )
                )
            else:
                other += 1
        elif spelled in modules and not escapes and not (isinstance(parent, ast.Attribute) and parent.value is node):
            escapes = spelled
    return Uses(frozenset(spellings), tuple(sorted(calls, key=lambda c: c.line)), other, escapes, rebound, shadowed)


def _top_level_nodes(tree: ast.Module):
    """Nodes run when the module is imported (not inside a function or lambda body)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(node.decorator_list if not isinstance(node, ast.Lambda) else [])
            continue
        stack.extend(ast.iter_child_nodes(node))


def _bindings(tree: ast.Module, name: str) -> List[str]:
    """How the file binds `name` itself: "def" for a top-level function, "other" for anything else."""
    found: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found.append("def" if node in tree.body and not isinstance(node, ast.ClassDef) else "other")
        elif isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append("other")
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            found.append("other")
        elif isinstance(node, ast.arg) and node.arg == name:
            found.append("other")
    return sorted(set(found))


def relays(index: "ProjectIndex", path: str, name: str) -> FrozenSet[str]:
    """The files that only re-export `name` of the module at `path` to others: a package's
    `__init__.py` with `from .checkpoint import save_checkpoint` (unaliased, never called or used
    otherwise there) that other files import it from (Swin-Transformer's forks with a `utils/`
    package). Their importers use `name` as if they imported it from `path`."""
    memo = index.__dict__.setdefault("_caller_relays", {})
    key = (path, name)
    if key not in memo:
        found = set()
        for other, how in importers(index, path):
            if name not in how.names or name not in index.imported_from(other) or other == path:
                continue
            known = uses(index, other, path, name)
            if known is not None and known.spellings == {name} and not (
                known.calls or known.other or known.escapes or known.rebound or known.shadowed
            ):
                found.add(other)
        memo[key] = frozenset(found)
    return memo[key]


def relayed_by(index: "ProjectIndex", path: str, name: str) -> FrozenSet[str]:
    """Every file re-exporting `name` of the module at `path`, directly or through other relays."""
    memo = index.__dict__.setdefault("_caller_relayed_by", {})
    key = (path, name)
    if key not in memo:
        seen, frontier = {path}, [path]
        while frontier:
            current = frontier.pop()
            for relay in sorted(relays(index, current, name) - seen):
                seen.add(relay)
                frontier.append(relay)
        memo[key] = frozenset(seen - {path})
    return memo[key]


def importers_through_relays(index: "ProjectIndex", path: str, names: List[str]) -> List[Tuple[str, "Importing", str]]:
    """(file, how it imports, the module it imports from) for every file that may reach one of
    `names` of the module at `path`: its importers, and the importers of the relays of those names
    (and of theirs: a user must see what it reaches however deep; a decision refuses a relay's
    relay where it cannot follow one)."""
    memo = index.__dict__.setdefault("_caller_importing", {})
    key = (path, tuple(names))
    if key not in memo:
        found = [(other, how, path) for other, how in importers(index, path)]
        sources = {path}
        frontier = [(path, name) for name in names]
        while frontier:
            source, name = frontier.pop(0)
            for relay in sorted(relays(index, source, name) - sources):
                sources.add(relay)
                found.extend((other, how, relay) for other, how in importers(index, relay) if other not in sources)
                frontier.append((relay, name))
        memo[key] = found
    return memo[key]
