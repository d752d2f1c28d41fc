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
import re
import warnings
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from ampmigrate.api import STAR_EXPORTS
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.engine.fast_regex import compile_trigger

_Names = FrozenSet[str]
_EMPTY: _Names = frozenset()
# Fields of statements and their parts that hold statements rather than expressions.
_BLOCK_FIELDS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


# The last text `parse` accepted (the text only, not its tree): the pipeline's check that
# CPython's parser accepts a file before LibCST sees it need not parse it a second time.
_last_parsed: Optional[str] = None


def parse(text: str, *, remember: bool = True) -> Optional[ast.Module]:
    """`text` parsed with `ast`, or None where it cannot be (the pipeline reports it).
    `remember=False` for a fragment (a string annotation): `parsed_last` keeps the file."""
    global _last_parsed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not ours to show
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    if remember:
        _last_parsed = text
    return tree


def accepted(text: str) -> None:
    """`text` is known to parse (it did in another process: the runner's first round), as if
    `parse` had just accepted it."""
    global _last_parsed
    _last_parsed = text


def parsed_last(text: str) -> bool:
    """Whether `text` is the text `parse` last accepted."""
    return text is _last_parsed or (_last_parsed is not None and text == _last_parsed)


class QualifiedNameScreen:
    """Which of a fixed set of qualified-name prefixes a source file can reach."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes: FrozenSet[str] = frozenset(prefixes)
        # Proper prefixes of the prefixes: the only partial names worth following.
        self._partial: Set[str] = set()
        for prefix in self.prefixes:
            parts = prefix.split(".")
            self._partial.update(".".join(parts[:k]) for k in range(1, len(parts)))
        # An attribute `x.attr` can only denote a followed name if `attr` ends one (of two or
        # more segments: a one-segment name comes from an import, never from an attribute).
        self.useful_attrs: FrozenSet[str] = frozenset(
            name.rsplit(".", 1)[1] for name in self.prefixes | self._partial if "." in name
        )
        words = "|".join(sorted(re.escape(attr) for attr in self.useful_attrs))
        self.useful_word = compile_trigger(rf"\b(?:{words})\b") if words else None

    def reachable(self, text: str) -> Optional[FrozenSet[str]]:
        """The prefixes `text` can reach, or None when it cannot be parsed with `ast`."""
        tree = parse(text)
        return None if tree is None else self.reachable_in(tree, text)

    def reachable_in(
        self, tree: ast.Module, text: str, needed: Sequence[FrozenSet[str]] = ()
    ) -> Optional[FrozenSet[str]]:
        """The prefixes the file `text`, parsed as `tree`, can reach (None: too deep to follow).
        With `needed` (the prefix sets of the rules asking), the search may stop as soon as each
        set has a reachable prefix: the answer is then only part of what the file reaches, but
        the same for every question of the form "does it reach one of these?" over `needed`."""
        try:
            return _Search(self, tree, text, needed).run()
        except (RecursionError, MemoryError):
            return None  # e.g. an attribute chain thousands deep: let LibCST decide

    # ------------------------------------------------------------------ name bookkeeping
    def hits(self, qname: str) -> Set[str]:
        """The prefixes `qname` is equal to or under: those among its own dotted prefixes (one
        set lookup per part, not a test per prefix)."""
        found = set()
        end = qname.find(".")
        while end != -1:
            if qname[:end] in self.prefixes:
                found.add(qname[:end])
            end = qname.find(".", end + 1)
        if qname in self.prefixes:
            found.add(qname)
        return found

    def hits_star(self, module: str) -> Set[str]:
        """The prefixes a name under `module` may be, or be under."""
        return {p for p in self.prefixes if p == module or p.startswith(module + ".") or module.startswith(p + ".")}

    def keep(self, qname: str) -> bool:
        return qname in self._partial


class _Search:
    def __init__(self, screen: QualifiedNameScreen, tree: ast.Module, text: str, needed: Sequence[FrozenSet[str]] = ()) -> None:
        self.needed = needed
        self.screen = screen
        self.tree = tree
        self.text = text
        self.found: Set[str] = set()
        # name -> partial qualified names it may be bound to (imports and aliases)
        self.names: Dict[str, Set[str]] = {}
        # attribute name -> partial qualified names assigned to `<name>.attr` (self.x = ...)
        self.attrs: Dict[str, Set[str]] = {}
        self.statements: List[ast.stmt] = []
        self.aliases: List[Tuple[str, str, ast.AST]] = []  # ("name"|"attr", target, value)

    def _enough(self) -> bool:
        """Every rule asking (`needed`) reaches one of its prefixes already."""
        return bool(self.needed) and all(not prefixes.isdisjoint(self.found) for prefixes in self.needed)

    def run(self) -> FrozenSet[str]:
        self._collect_statements()
        if "apex" not in self.names and _FREE_APEX.search(self.text):
            self._bind("apex", "apex")  # the resolver's free `apex` (engine/names.py `_apex_free`)
        if len(self.found) == len(self.screen.prefixes) or not (self.names or self.attrs) or self._enough():
            # Nothing imported on the way to a prefix: no expression can get there either.
            return frozenset(self.found)
        self._propagate_aliases()
        memo: Dict[int, _Names] = {}
        for node in self._attribute_chains():
            before = len(self.found)
            self._qualified(node, memo)
            if len(self.found) > before and self._enough():
                return frozenset(self.found)
        if len(self.found) < len(self.screen.prefixes) and not self._enough():
            for node in self._text_annotation_chains():
                self._qualified(node, memo)
        return frozenset(self.found)

    def _text_annotation_chains(self) -> Iterator[ast.AST]:
        """Names inside string annotations and `# type:` comments, which the resolver reads too
        (analysis/string_annotations.py). Annotations belong to `def`s and annotated assignments,
        all of them among the collected statements: no walk of the whole tree."""
        texts: List[str] = []
        useful = self.screen.useful_word
        if useful is not None and ('"' in self.text or "'" in self.text):
            for statement in self.statements:
                for annotation in _annotations(statement):
                    texts.extend(
                        c.value
                        for c in ast.walk(annotation)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and useful.search(c.value)
                    )
        texts.extend(m.group(1) for m in _TYPE_COMMENT.finditer(self.text))
        for text in texts:
            tree = parse(text.strip(), remember=False)
            if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
                yield from (n for n in ast.walk(tree.body[0]) if isinstance(n, ast.Attribute))

    # ------------------------------------------------------------------ statements
    def _collect_statements(self) -> None:
        """Every statement (bodies of blocks included), its imports and alias assignments.
        Expressions are not walked here: that is most of a tree, and rarely needed."""
        stack: List[ast.AST] = list(reversed(self.tree.body))
        while stack:
            node = stack.pop()
            self.statements.append(node)
            kind = type(node)
            if kind is ast.Import:
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
                    elif node.module in STAR_EXPORTS:  # the resolver may give a free name `module.<name>`
                        self.found |= self.screen.hits_star(node.module)
            elif kind is ast.Assign:
                for target in node.targets:
                    self._alias(target, node.value)
            elif kind is ast.AnnAssign:
                if node.value is not None:
                    self._alias(node.target, node.value)
            else:
                for block in _blocks(node):
                    stack.extend(reversed(block))

    def _attribute_chains(self) -> List[ast.AST]:
        """Attributes named like the end of a followed name (from the one walk of the tree that
        the rules' own screens share, engine/ast_nodes.py)."""
        useful = self.screen.useful_attrs
        return [node for node in nodes_of(self.tree, ast.Attribute) if node.attr in useful]

    def _bind(self, name: str, qname: str) -> None:
        # A name can both be a prefix (`torch.cuda.amp`) and lead to a longer one
        # (`torch.cuda.amp.autocast`): record the hit and keep following it.
        self.found |= self.screen.hits(qname)
        if self.screen.keep(qname):
            self.names.setdefault(name, set()).add(qname)

    def _alias(self, target: ast.AST, value: ast.AST) -> None:
        module = _imported_module(value) if isinstance(value, ast.Call) else None
        if module is not None:  # `amp = importlib.import_module("apex.amp")`: an import
            if isinstance(target, ast.Name):
                self._bind(target.id, module)
            elif isinstance(target, ast.Attribute):
                self.found |= self.screen.hits(module)
                if self.screen.keep(module):
                    self.attrs.setdefault(target.attr, set()).add(module)
            return
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
                self.found |= self.screen.hits(qname)
                if self.screen.keep(qname):  # also when it is a hit: a longer prefix may follow
                    extended.add(qname)
            result = frozenset(extended)
        else:
            result = _EMPTY
        memo[key] = result
        return result


_FREE_APEX = re.compile(r"\bapex\s*\.\s*amp\b")


def _imported_module(call: ast.Call) -> Optional[str]:
    """`import_module("a.b")` / `importlib.import_module("a.b")` with one literal argument: "a.b"
    (engine/names.imported_module reads the same shape from LibCST, for importlib's function
    only: any `import_module` here keeps the screen a superset)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name != "import_module" or len(call.args) != 1 or call.keywords:
        return None
    value = call.args[0]
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return None
    if not all(part.isidentifier() for part in value.value.split(".")):
        return None
    return value.value


# ---------------------------------------------------------------------------------- tree shapes
_TYPE_COMMENT = re.compile(r"#\s*type:\s*([^#\r\n]+)")


def _annotations(statement: ast.AST) -> Iterator[ast.AST]:
    """The annotations a statement holds itself (not those of statements nested in it)."""
    kind = type(statement)
    if kind is ast.AnnAssign:
        yield statement.annotation
    elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
        arguments = statement.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
            if argument is not None and argument.annotation is not None:
                yield argument.annotation
        if statement.returns is not None:
            yield statement.returns


def _blocks(node: ast.AST) -> Iterator[List[ast.stmt]]:
    """The statement lists inside a compound statement (handlers' and cases' bodies too)."""
    for field in _BLOCK_FIELDS:
        value = getattr(node, field, None)
        if not value:
            continue
        if field in ("handlers", "cases"):
            for part in value:
                yield part.body
        else:
            yield value
