"""A sound, cheap check with Python's own `ast` of which qualified names a file can reach.

A rule may declare `qualified_prefixes`: dotted names such that it reports only in files where
the name resolver (engine/names.py) gives some expression or import one of those names or a
name under one (`torch.cuda.amp` covers `torch.cuda.amp.autocast`). Before a file is parsed
with LibCST (about 15 times slower than `ast.parse`), this module answers, from the `ast`,
which of the prefixes the file can reach; rules none of whose prefixes are reachable are
dropped for the file.

The answer over-approximates the resolver, so it never drops a rule that would report:

- every qualified name the resolver produces starts at an import binding (`import a.b [as c]`,
  absolute `from a import b [as c]`) and is extended one attribute at a time along a chain of
  `Name.attr.attr...` in the file, possibly through alias assignments (`x = torch.cuda`,
  `self.ac = torch.cuda.amp.autocast`, `x = a if c else b`, `a, b = x, y`);
- here every binding of a name counts wherever the name is used (no scopes, no flow), and an
  assignment to `<name>.attr` feeds every `<anything>.attr`, which is a superset of that.

Only names on the way to a prefix are tracked (`torch`, `torch.cuda` for `torch.cuda.amp`):
a name that is neither a prefix of one nor under one can never be extended into one, so the
search is finite and small. A file `ast` cannot parse (a syntax error, or syntax newer than
this Python) is not screened: LibCST decides.
"""

from __future__ import annotations

import ast
import warnings
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

_Names = FrozenSet[str]
_EMPTY: _Names = frozenset()


class QualifiedNameScreen:
    """Which of a fixed set of qualified-name prefixes a source file can reach."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes: FrozenSet[str] = frozenset(prefixes)
        # Proper prefixes of the prefixes: the only partial names worth following.
        self._partial: Set[str] = set()
        for prefix in self.prefixes:
            parts = prefix.split(".")
            self._partial.update(".".join(parts[:k]) for k in range(1, len(parts)))
        # The last segment of each partial name's possible extensions, to skip attributes
        # that cannot lead anywhere without building strings.
        self._useful_attrs: Set[str] = {p.split(".")[-1] for p in self.prefixes | self._partial}

    def reachable(self, text: str) -> Optional[FrozenSet[str]]:
        """The prefixes `text` can reach, or None when it cannot be parsed with `ast`."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not ours to show
                tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return None
        return _Search(self, tree).run()

    # ------------------------------------------------------------------ name bookkeeping
    def hits(self, qname: str) -> Set[str]:
        """The prefixes `qname` is equal to or under."""
        found = set()
        for prefix in self.prefixes:
            if qname == prefix or qname.startswith(prefix + "."):
                found.add(prefix)
        return found

    def keep(self, qname: str) -> bool:
        return qname in self._partial


class _Search:
    def __init__(self, screen: QualifiedNameScreen, tree: ast.AST) -> None:
        self.screen = screen
        self.tree = tree
        self.found: Set[str] = set()
        # name -> partial qualified names it may be bound to (imports and aliases)
        self.names: Dict[str, Set[str]] = {}
        # attribute name -> partial qualified names assigned to `<name>.attr` (self.x = ...)
        self.attrs: Dict[str, Set[str]] = {}
        self.chains: List[ast.AST] = []  # every Attribute node (and Names used as aliases)
        self.aliases: List[Tuple[str, str, ast.AST]] = []  # ("name"|"attr", target, value)

    def run(self) -> FrozenSet[str]:
        self._collect()
        if len(self.found) == len(self.screen.prefixes):
            return frozenset(self.found)
        self._propagate_aliases()
        memo: Dict[int, _Names] = {}
        for node in self.chains:
            self._qualified(node, memo)
        return frozenset(self.found)

    # ------------------------------------------------------------------ one pass over the tree
    def _collect(self) -> None:
        screen = self.screen
        useful = screen._useful_attrs
        for node in ast.walk(self.tree):
            kind = type(node)
            if kind is ast.Attribute:
                if node.attr in useful:
                    self.chains.append(node)
            elif kind is ast.Import:
                for alias in node.names:
                    if alias.asname:
                        self._bind(alias.asname, alias.name)
                    else:
                        top = alias.name.split(".")[0]
                        self._bind(top, top)
            elif kind is ast.ImportFrom:
                if node.level or not node.module:
                    continue  # relative imports have no qualified name in the resolver
                for alias in node.names:
                    if alias.name != "*":
                        self._bind(alias.asname or alias.name, f"{node.module}.{alias.name}")
            elif kind is ast.Assign:
                for target in node.targets:
                    self._alias(target, node.value)
            elif kind is ast.AnnAssign:
                if node.value is not None:
                    self._alias(node.target, node.value)

    def _bind(self, name: str, qname: str) -> None:
        hits = self.screen.hits(qname)
        if hits:
            self.found |= hits
        elif self.screen.keep(qname):
            self.names.setdefault(name, set()).add(qname)

    def _alias(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.aliases.append(("name", target.id, value))
        elif isinstance(target, ast.Attribute):
            self.aliases.append(("attr", target.attr, value))
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            if len(target.elts) == len(value.elts):
                for element, element_value in zip(target.elts, value.elts):
                    self._alias(element, element_value)

    # ------------------------------------------------------------------ aliases, to a fixpoint
    def _propagate_aliases(self) -> None:
        # Every round either adds a partial name to some binding or stops; there are finitely
        # many partial names, so this ends.
        changed = True
        while changed:
            changed = False
            memo: Dict[int, _Names] = {}
            for kind, target, value in self.aliases:
                names = self._value_names(value, memo)
                if not names:
                    continue
                table = self.names if kind == "name" else self.attrs
                bound = table.setdefault(target, set())
                if not names <= bound:
                    bound |= names
                    changed = True

    def _value_names(self, value: ast.AST, memo: Dict[int, _Names]) -> _Names:
        if isinstance(value, ast.IfExp):
            return self._value_names(value.body, memo) | self._value_names(value.orelse, memo)
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self._qualified(value, memo)
        return _EMPTY

    # ------------------------------------------------------------------ expressions
    def _qualified(self, node: ast.AST, memo: Dict[int, _Names]) -> _Names:
        """Partial names `node` may denote; names under a prefix go to `found` on the way."""
        key = id(node)
        cached = memo.get(key)
        if cached is not None:
            return cached
        if isinstance(node, ast.Name):
            result = frozenset(self.names.get(node.id, _EMPTY))
        elif isinstance(node, ast.Attribute):
            extended = set(self.attrs.get(node.attr, _EMPTY))
            for base in self._qualified(node.value, memo):
                qname = f"{base}.{node.attr}"
                hits = self.screen.hits(qname)
                if hits:
                    self.found |= hits
                elif self.screen.keep(qname):
                    extended.add(qname)
            result = frozenset(extended)
        else:
            result = _EMPTY
        memo[key] = result
        return result
