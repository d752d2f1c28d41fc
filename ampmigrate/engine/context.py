"""What a rule sees for one parsed file, and how it describes a fix.

`FileContext` is shared by all rules of one file (one parse, one name pass, lazily computed
positions, and `shared()` for analyses several rules of a family reuse). Each rule gets a
`RuleContext` view whose `report()` stamps the rule's code. Fixes are built with `FixBuilder`
as CST replacements; the engine turns them into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import CodeRange

from ampmigrate.config import Settings
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.names import NameIndex
from ampmigrate.engine.positions import Positions
from ampmigrate.rules.base import Rule

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ProjectIndex

_MISSING = object()


@dataclass(eq=False)
class Report:
    code: str
    node: cst.CSTNode
    message: str
    severity: str
    fix: Optional[Fix]
    no_fix_reason: Optional[str]


# Attributes only torch has among what a star import may bind as `torch` (FileContext._star_bound_by_use).
TORCH_EVIDENCE = frozenset(
    ("nn", "cuda", "optim", "no_grad", "float16", "float32", "bfloat16", "autocast", "distributed", "backends", "Tensor")
)


class FileContext:
    def __init__(
        self, path: str, text: str, module: cst.Module, settings: Settings, star_bound: Optional[Dict[str, str]] = None
    ) -> None:
        self.path = path
        self.text = text
        self.module = module
        self.settings = settings
        # `star_bound`: free names the file's star imports bind (ProjectIndex.star_bound).
        self.names = NameIndex(module, star_bound)
        self.reports: List[Report] = []
        self._positions: Optional[Positions] = None
        self._shared: Dict[Any, Any] = {}
        self._quote: Optional[str] = None
        # Module-level names other files of the project import from this one (fix mode only).
        self.imported_elsewhere: FrozenSet[str] = frozenset()
        # The run's project index (engine/project_index.py), when the runner built one.
        self.project_index: Optional["ProjectIndex"] = None
        # Whether `imported_elsewhere` comes from a scan of the project (set by the pipeline).
        self.imports_scanned = False

    def exported(self, binding) -> bool:
        """Whether another module of the project imports this module-level binding by name."""
        return binding.scope is self.names.module_scope and binding.name in self.imported_elsewhere

    def imported_by_others(self, binding) -> Optional[bool]:
        """Whether another file (of the project scan or of the run's index) imports this
        module-level binding by name; None where neither was built (a lone text: not known)."""
        if binding.scope is not self.names.module_scope:
            return False
        if self.exported(binding):
            return True
        if self.project_index is not None and binding.name in self.project_index.imported_from(self.path):
            return True
        if not self.imports_scanned and self.project_index is None:
            return None
        return False

    def reexported(self, binding) -> bool:
        """Whether this module hands the module-level `binding` on to others: listed in `__all__`,
        or an import of a package's `__init__.py` that the package itself does not use."""
        if binding.scope is not self.names.module_scope:
            return False
        if binding.name in self.shared("names.dunder_all", self.names.dunder_all):
            return True
        is_package = self.path.replace("\\", "/").rsplit("/", 1)[-1] == "__init__.py"
        return is_package and binding.kind in ("import", "from-import") and not self.names.references(binding)

    def release(self) -> None:
        """The file is done: drop what the rules built and let go of the tree. Shared analyses
        and visitors defined inside functions point back at this context or its name index
        (cycles), which would keep the whole tree alive until a collection walked it all; after
        this it is freed as soon as the last reference to it goes."""
        self._shared.clear()
        self.reports = []
        self._positions = None
        self.names.release()
        self.module = None  # type: ignore[assignment]

    # ------------------------------------------------------------------ shared analyses
    def shared(self, key: Any, factory: Callable[[], Any]) -> Any:
        """Compute an analysis once per file for all the rules that need it."""
        value = self._shared.get(key, _MISSING)
        if value is _MISSING:
            value = self._shared[key] = factory()
        return value

    # ------------------------------------------------------------------ source positions
    def position(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:  # computed once, only for files with something to report
            self._positions = Positions(self.module)
        return self._positions[node]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # ------------------------------------------------------------------ emitting code
    @property
    def quote(self) -> str:
        """The file's usual quote character, so inserted strings match its style."""
        if self._quote is None:
            singles = self.text.count("'")
            doubles = self.text.count('"')
            self._quote = "'" if singles > doubles else '"'
        return self._quote

    def string(self, value: str) -> cst.SimpleString:
        return cst.SimpleString(f"{self.quote}{value}{self.quote}")

    def parse_expression(self, code: str) -> cst.BaseExpression:
        return cst.parse_expression(code, config=self.module.config_for_parsing)

    def parse_statement(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code, config=self.module.config_for_parsing)

    def module_reference(self, at: cst.CSTNode, module: str = "torch") -> Tuple[Optional[str], bool]:
        """How code inserted at `at` can name `module`: (expression text, needs an import).

        Uses a name the file already binds to exactly that module there (`import torch as th`
        gives 'th'); else the plain name if it is free there (the caller adds `import torch`);
        else (None, False): the name is taken by something else.
        """
        scope = self.names.scope_of(at)

        def denotes(name: str) -> bool:
            found = self.names.lookup(name, scope)
            return bool(found) and all(
                b.kind in ("import", "from-import") and b.qname == module for b in found
            ) and (found[0].scope.kind != "function" or any(self._runs_before(b.statement, at) for b in found))

        top = module.split(".")[0]
        if module == top and denotes(top):
            return top, False
        for name in self._names_binding(module):
            if denotes(name):
                return name, False
        if module == top and not self.names.lookup(top, scope) and self.names.star_bound.get(top) == module:
            return top, False  # bound by the file's star imports to that very module (engine/apex_star.py)
        if module == top and self.names.is_free(top, scope):
            return top, True
        if module == top and self._star_bound_by_use(top, scope, at):
            return top, False
        return None, False

    def _runs_before(self, statement: Optional[cst.CSTNode], at: cst.CSTNode) -> bool:
        """A function's local import runs before `at` on every path: its line is in a block that
        holds `at`, before it (Swin's `build_model()` imports `torch.nn as nn` only in the `else:`
        of the `if` whose body the fix writes `nn.LayerNorm` in: not there)."""
        names = self.names
        line = names.parent(statement) if statement is not None else None
        block = names.parent(line) if line is not None else None
        if not isinstance(block, cst.IndentedBlock):
            return False
        body = list(block.body)
        for ancestor in (at, *names.ancestors(at)):
            parent = names.parent(ancestor)
            if parent is block:
                return ancestor in body and line in body and body.index(line) < body.index(ancestor)
        return False

    def _star_bound_by_use(self, name: str, scope, at: cst.CSTNode) -> bool:
        """`from utils import *` binds `torch`, and the file shows it: the name is bound nowhere in
        the file, every star import is at the top level before `at`, and the file's own code
        reads `torch.<attribute>` of torch's (`torch.nn`, `torch.cuda`) through that global, which
        runs only because the star import bound torch there. Code inserted at `at` can use it too."""
        names = self.names
        if not names.has_star_import or names.lookup(name, scope) or names.lookup(name, names.module_scope):
            return False
        at_line = self.position(at).start.line
        for node in names.nodes_of_type((cst.ImportFrom,)):
            if isinstance(node.names, cst.ImportStar):
                if names.parent(names.parent(node)) is not self.module or self.position(node).start.line >= at_line:
                    return False
        for load, load_scope in names.loads.items():
            if load.value != name or names.lookup(name, load_scope):
                continue
            parent = names.parent(load)
            if isinstance(parent, cst.Attribute) and parent.value is load and parent.attr.value in TORCH_EVIDENCE:
                return True
        return False

    def _names_binding(self, module: str) -> List[str]:
        """Each scope's names with a binding to exactly `module`, in the order of the scopes and
        of their bindings: worked out once per file (one pass over every binding for all the
        modules asked), not a pass over every binding of the file at each call."""
        by_module = self._shared.get(_NAMES_BINDING)
        if by_module is None:
            by_module = self._shared[_NAMES_BINDING] = {}
            for candidate in self.names.scopes:
                for name, bindings in candidate.bindings.items():
                    for qname in dict.fromkeys(b.qname for b in bindings if b.qname is not None):
                        by_module.setdefault(qname, []).append(name)
        return by_module.get(module, [])


_NAMES_BINDING = object()  # the key of `_names_binding`'s map in `FileContext._shared`


class RuleContext:
    """A rule's view of the file: everything FileContext has, and `report` for this rule."""

    def __init__(self, file: FileContext, rule: Rule) -> None:
        self.file = file
        self.rule = rule
        self.rule_code = rule.code
        self.names = file.names
        self.settings = file.settings
        self.module = file.module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        fix: Optional[Fix] = None,
        no_fix_reason: Optional[str] = None,
        code: Optional[str] = None,
    ) -> None:
        code = code or self.rule.code
        severity = self.rule.doc.severity if code == self.rule.code else "warning"
        self.file.reports.append(Report(code, node, message, severity, fix, no_fix_reason))

    def fix(self, message: str, applicability: Optional[str] = None, requires: Iterable[str] = ()) -> "FixBuilder":
        """Start a fix; its safety defaults to the rule's catalogue entry."""
        if applicability is None:
            applicability = UNSAFE if self.rule.doc.fix == "unsafe" else SAFE
        return FixBuilder(message, applicability, frozenset({self.rule.code, *requires}))


def _inserted_around(before: List[Any], after: List[Any], leading_lines: List[cst.EmptyLine]):
    """A replacement function: `before`, the node as the other changes left it (its leading lines
    set to `leading_lines`), then `after`."""

    def replacement(updated: cst.CSTNode) -> cst.FlattenSentinel:
        return cst.FlattenSentinel([*before, updated.with_changes(leading_lines=leading_lines), *after])

    return replacement


def _amended(new: Any, change: Callable[[cst.CSTNode], cst.CSTNode]) -> Any:
    return change(new) if isinstance(new, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else new


class FixBuilder:
    """Collects CST changes for one fix: replacements, removals and statement insertions."""

    def __init__(self, message: str, applicability: str, requires: frozenset) -> None:
        self.message = message
        self.applicability = applicability
        self.requires = requires
        self._replace: Dict[cst.CSTNode, Any] = {}
        self._before: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self._after: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self._imports: List[str] = []

    def replace(self, node: cst.CSTNode, new: Any) -> "FixBuilder":
        """Replace `node` with `new`: a node, a FlattenSentinel, REMOVE, or a function of the
        node as the changes inside it left it (so it composes with them)."""
        if node in self._replace and self._replace[node] is not new:
            raise ValueError("a fix replaces the same node twice")
        self._replace[node] = new
        return self

    def amend(self, node: cst.CSTNode, change: Callable[[cst.CSTNode], cst.CSTNode]) -> "FixBuilder":
        """Apply `change` to the statement that replaces `node` (a node, or a function's result);
        no change where it is removed, flattened or has statements inserted before it."""
        new = self._replace.get(node)
        if node in self._before or new is None or new is cst.RemovalSentinel.REMOVE or isinstance(new, cst.FlattenSentinel):
            return self
        if callable(new):
            self._replace[node] = lambda updated, first=new: _amended(first(updated), change)
        else:
            self._replace[node] = _amended(new, change)
        return self

    def remove(self, node: cst.CSTNode) -> "FixBuilder":
        return self.replace(node, cst.RemovalSentinel.REMOVE)

    def move_away(self, statement: cst.CSTNode) -> "FixBuilder":
        """Remove a statement the fix has put elsewhere (into a new `with` block): unlike
        `remove`, its leading blank lines went with it, so the next statement does not take them."""
        return self.replace(statement, cst.FlattenSentinel([]))

    def insert_before(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> "FixBuilder":
        self._before.setdefault(statement, []).extend(new)
        return self

    def insert_after(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> "FixBuilder":
        self._after.setdefault(statement, []).extend(new)
        return self

    def require_import(self, module: str) -> "FixBuilder":
        if module not in self._imports:
            self._imports.append(module)
        return self

    def replaces(self, node: cst.CSTNode) -> bool:
        return node in self._replace

    def targets(self) -> List[cst.CSTNode]:
        """Every node this fix replaces, removes, or inserts statements next to."""
        return list(dict.fromkeys([*self._replace, *self._before, *self._after]))

    def replacement(self, node: cst.CSTNode) -> Any:
        return self._replace.get(node)

    def replaced(self) -> List[cst.CSTNode]:
        """The nodes this fix replaces or removes (statements merely inserted next to are not)."""
        return list(self._replace)

    def build(self) -> Fix:
        changes: List[Tuple[cst.CSTNode, Any]] = []
        targets = list(dict.fromkeys([*self._replace, *self._before, *self._after]))
        for target in targets:
            replacement = self._replace.get(target, target)
            before = self._before.get(target, [])
            after = self._after.get(target, [])
            if not before and not after:
                changes.append((target, replacement))
                continue
            if callable(replacement):
                raise ValueError("statements cannot be inserted next to a node replaced by a function")
            items: List[Any] = list(before)
            moved_blanks: Optional[List[cst.EmptyLine]] = None  # the target keeps the rest of its lines
            if before and isinstance(target, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                # Blank lines above the target now separate the inserted statements instead.
                lead = list(getattr(replacement, "leading_lines", ()) or ())
                blank = 0
                while blank < len(lead) and lead[blank].comment is None:
                    blank += 1
                if blank and replacement is not cst.RemovalSentinel.REMOVE:
                    items[0] = items[0].with_changes(leading_lines=lead[:blank])
                    if replacement is target:
                        moved_blanks = lead[blank:]
                    else:
                        replacement = replacement.with_changes(leading_lines=lead[blank:])
            if moved_blanks is not None:
                # The target itself stays, with the changes made inside it (a copy would lose them).
                changes.append((target, _inserted_around(items, after, moved_blanks)))
                continue
            if isinstance(replacement, cst.FlattenSentinel):
                items.extend(replacement.nodes)  # a statement replaced by several
            elif replacement is not cst.RemovalSentinel.REMOVE:
                items.append(replacement)
            items.extend(after)
            changes.append((target, cst.FlattenSentinel(items)))
        return Fix(
            message=self.message,
            applicability=self.applicability,
            changes=tuple(changes),
            imports=tuple(self._imports),
            requires=self.requires,
        )


def statement_line(ctx: FileContext, code: str) -> cst.SimpleStatementLine:
    statement = ctx.parse_statement(code)
    assert isinstance(statement, cst.SimpleStatementLine), code
    return statement


def rebuild_args(call: cst.Call, args: Sequence[cst.Arg]) -> cst.Call:
    """`call` with a new argument list, keeping its comma style (one line or one per line)."""
    old = call.args
    sep = next((a.comma for a in old[:-1] if isinstance(a.comma, cst.Comma)), None)
    if sep is None:
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    trailing = old[-1].comma if old and isinstance(old[-1].comma, cst.Comma) else None
    # An argument appended after the old last one takes over the line break before `)`.
    moved = None
    if old and not isinstance(old[-1].comma, cst.Comma) and args and args[-1] is not old[-1]:
        if any(a is old[-1] for a in args) and _breaks_line(old[-1].whitespace_after_arg):
            moved = old[-1].whitespace_after_arg
    out: List[cst.Arg] = []
    for index, arg in enumerate(args):
        if index == len(args) - 1:
            comma = trailing if trailing is not None else cst.MaybeSentinel.DEFAULT
            if moved is not None:
                arg = arg.with_changes(whitespace_after_arg=moved)
        else:
            comma = arg.comma if isinstance(arg.comma, cst.Comma) else sep
            if old and arg is old[-1] and trailing is not None:
                comma = sep  # the trailing comma moves to the new last argument
            if moved is not None and arg is old[-1]:
                arg = arg.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        out.append(arg.with_changes(comma=comma))
    return call.with_changes(args=out)


def without_items(node: cst.CSTNode, removed: Sequence[cst.CSTNode]) -> cst.CSTNode:
    """`node` (a dict, list, tuple or set display, a call, or a `from` import) without the
    `removed` elements, arguments or names, keeping its layout valid: when the last item goes, the one before it takes over
    its comma (or lack of one), so `{"a": 1, "b": 2}` loses `"b": 2` as `{"a": 1}` and a
    one-item-per-line literal keeps its closing line.
    """
    if isinstance(node, cst.Call):
        field_name = "args"
    elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        field_name = "names"
    elif isinstance(node, (cst.Dict, cst.List, cst.Tuple, cst.Set)):
        field_name = "elements"
    else:
        raise TypeError(f"cannot remove items from {type(node).__name__}")
    items = list(getattr(node, field_name))
    gone = set(map(id, removed))
    if not gone <= set(map(id, items)):
        raise ValueError("a removed item is not an item of the node")
    kept = [item for item in items if id(item) not in gone]
    if kept and id(items[-1]) in gone:
        kept[-1] = kept[-1].with_changes(comma=items[-1].comma)
    if isinstance(node, cst.Tuple) and len(kept) == 1 and not isinstance(kept[0].comma, cst.Comma):
        kept[0] = kept[0].with_changes(comma=cst.Comma())  # (x,) stays a tuple
    if isinstance(node, cst.Tuple) and not kept and not node.lpar:
        return node.with_changes(elements=[], lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node.with_changes(**{field_name: kept})


def _breaks_line(whitespace: cst.BaseParenthesizableWhitespace) -> bool:
    return isinstance(whitespace, cst.ParenthesizedWhitespace)
