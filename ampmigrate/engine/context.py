"""What a rule sees for one parsed file, and how it describes a fix.

`FileContext` is shared by all rules of one file (one parse, one name pass, lazily computed
positions, and `shared()` for analyses several rules of a family reuse). Each rule gets a
`RuleContext` view whose `report()` stamps the rule's code. Fixes are built with `FixBuilder`
as CST replacements; the engine turns them into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import CodeRange

from ampmigrate.config import Settings
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.names import NameIndex
from ampmigrate.engine.positions import Positions
from ampmigrate.rules.base import Rule

_MISSING = object()


@dataclass(eq=False)
class Report:
    code: str
    node: cst.CSTNode
    message: str
    severity: str
    fix: Optional[Fix]
    no_fix_reason: Optional[str]


class FileContext:
    def __init__(self, path: str, text: str, module: cst.Module, settings: Settings) -> None:
        self.path = path
        self.text = text
        self.module = module
        self.settings = settings
        self.names = NameIndex(module)
        self.reports: List[Report] = []
        self._positions: Optional[Positions] = None
        self._shared: Dict[Any, Any] = {}
        self._quote: Optional[str] = None

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
            )

        top = module.split(".")[0]
        if module == top and denotes(top):
            return top, False
        for candidate in self.names.scopes:
            for name, bindings in candidate.bindings.items():
                if any(b.qname == module for b in bindings) and denotes(name):
                    return name, False
        if module == top and self.names.is_free(top, scope):
            return top, True
        return None, False


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
        if node in self._replace and self._replace[node] is not new:
            raise ValueError("a fix replaces the same node twice")
        self._replace[node] = new
        return self

    def remove(self, node: cst.CSTNode) -> "FixBuilder":
        return self.replace(node, cst.RemovalSentinel.REMOVE)

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
            items: List[Any] = list(before)
            if before and isinstance(target, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                # Blank lines above the target now separate the inserted statements instead.
                lead = list(getattr(replacement, "leading_lines", ()) or ())
                blank = 0
                while blank < len(lead) and lead[blank].comment is None:
                    blank += 1
                if blank and replacement is not cst.RemovalSentinel.REMOVE:
                    items[0] = items[0].with_changes(leading_lines=lead[:blank])
                    replacement = replacement.with_changes(leading_lines=lead[blank:])
            if replacement is not cst.RemovalSentinel.REMOVE:
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
    out: List[cst.Arg] = []
    for index, arg in enumerate(args):
        if index == len(args) - 1:
            comma = trailing if trailing is not None else cst.MaybeSentinel.DEFAULT
        else:
            comma = arg.comma if isinstance(arg.comma, cst.Comma) else sep
        out.append(arg.with_changes(comma=comma))
    return call.with_changes(args=out)
