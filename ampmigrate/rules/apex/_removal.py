"""Removing apex imports a fix leaves unused, and the statements that only existed for them.

An apex import is often wrapped: `try: from apex import amp / except ImportError: amp = None`,
`if args.fp16: from apex import amp / else: amp = None`. When the import goes, a `try` whose
handlers only set the fallback, raise or log goes with it, the `else` that only set the fallback
goes, and an `if` left without a body (and without an `else`) goes too (Python needs one, and an
`if x: pass` is noise). Everything else keeps its statements; a block emptied here gets a
`pass` from the engine.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import body_of, containing_block
from ampmigrate.engine.context import FixBuilder
from ampmigrate.engine.names import Binding, NameIndex


class Removal:
    """Statements (and import aliases) one fix deletes; `emit` turns them into minimal changes."""

    def __init__(self, names: NameIndex) -> None:
        self.names = names
        self.statements: Set[cst.CSTNode] = set()  # small or compound statements
        self.aliases: Dict[cst.CSTNode, Set[cst.ImportAlias]] = {}  # import node -> aliases to drop
        self.fallback_names: Set[str] = set()  # names an except-handler may set on ImportError

    def remove_statement(self, statement: cst.CSTNode) -> None:
        self.statements.add(statement)

    def remove_import_binding(self, binding: Binding) -> None:
        statement = binding.statement
        if isinstance(statement, (cst.Import, cst.ImportFrom)) and isinstance(binding.node, cst.ImportAlias):
            self.aliases.setdefault(statement, set()).add(binding.node)
            self.fallback_names.add(binding.name)

    # ------------------------------------------------------------------ planning
    def _removed_small(self) -> Set[cst.CSTNode]:
        removed: Set[cst.CSTNode] = set()
        for statement in self.statements:
            removed.add(statement)
        for node, aliases in self.aliases.items():
            names = node.names if not isinstance(node.names, cst.ImportStar) else ()
            if all(alias in aliases for alias in names):
                removed.add(node)
            removed.update(self._fallbacks(node, aliases))
        for node, aliases in self.aliases.items():
            removed.update(self._global_declarations(node, aliases, removed))
        return removed

    def _global_declarations(
        self, node: cst.CSTNode, aliases: Set[cst.ImportAlias], removed: Set[cst.CSTNode]
    ) -> List[cst.CSTNode]:
        """`global amp` in the function whose `from apex import amp` goes, when every name it
        declares loses every binding that function made (the import, its fallbacks)."""
        function = next((a for a in self.names.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.ClassDef))), None)
        if not isinstance(function, cst.FunctionDef):
            return []
        scope = self.names.scope_entries.get(function.body)
        if scope is None or not scope.global_names:
            return []
        gone = set(removed) | set(aliases)
        found: List[cst.CSTNode] = []
        for statement in self.names.nodes_of_type((cst.Global,)):
            if self.names.scope_of(statement) is not scope:
                continue
            declared = [item.name.value for item in statement.names]
            if all(self._bound_only_by(function, name, gone) for name in declared):
                found.append(statement)
        return found

    def _bound_only_by(self, function: cst.FunctionDef, name: str, gone: Set[cst.CSTNode]) -> bool:
        """Every binding of the module-level `name` made inside `function` is among `gone`."""
        bindings = self.names.module_scope.bindings.get(name, [])
        inside = [b for b in bindings if function in self.names.ancestors(b.node)]
        if not inside:
            return False
        return all(b.node in gone or b.statement in gone for b in inside)

    def _fallbacks(self, node: cst.CSTNode, aliases: Set[cst.ImportAlias]) -> List[cst.CSTNode]:
        """`amp = None` in the `except ImportError:` of the `try` that imported `amp`."""
        bound = {
            (a.asname.name.value if a.asname is not None else cst.Module([]).code_for_node(a.name).split(".")[0])
            for a in aliases
            if a.asname is None or isinstance(a.asname.name, cst.Name)
        }
        found: List[cst.CSTNode] = []
        child: cst.CSTNode = node
        for ancestor in self.names.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(ancestor, cst.If) and child is ancestor.body and isinstance(ancestor.orelse, cst.Else):
                # `if use_apex: from apex import amp ... else: amp = None`
                found.extend(none_assignments(body_of(ancestor.orelse.body) or (), bound))
            child = ancestor
            if not isinstance(ancestor, cst.Try):
                continue
            for handler in ancestor.handlers:
                found.extend(none_assignments(body_of(handler.body) or (), bound))
            break
        return found

    def _line_removed(self, line: cst.CSTNode, removed: Set[cst.CSTNode]) -> bool:
        if line in removed:
            return True
        if isinstance(line, cst.SimpleStatementLine):
            return all(small in removed for small in line.body)
        return False

    def _block_emptied(self, block: cst.CSTNode, removed: Set[cst.CSTNode]) -> bool:
        body = body_of(block)
        if body is None:
            return isinstance(block, cst.SimpleStatementSuite) and all(s in removed for s in block.body)
        return all(self._line_removed(statement, removed) for statement in body)

    def _keep_blank_lines(self, builder: FixBuilder, statement: cst.CSTNode, removed: Set[cst.CSTNode], replacements) -> None:
        """The blank lines above a removed statement stay, above the statement that follows it
        (`import os / <blank> / import apex / import torch` keeps its blank line)."""
        blanks = _leading_blanks(statement)
        block = containing_block(self.names, statement)
        body = body_of(block) if block is not None else None
        if not body:
            return
        index = next(i for i, s in enumerate(body) if s is statement)
        kept = [s for s in body if not self._line_removed(s, removed) or s in replacements]
        following = next((s for s in body[index + 1 :] if s in kept), None)
        first_in_block = following is not None and kept[0] is following and isinstance(block, cst.IndentedBlock)
        if first_in_block and following not in replacements and builder.replaces(following):
            # It opens its block and is rewritten itself (`with amp.scale_loss` after the removed
            # `from apex import amp`): its rewrite opens the block without the blank lines.
            builder.amend(following, lambda new: new.with_changes(leading_lines=new.leading_lines[len(_leading_blanks(new)):]))
            return
        if following is None or following in replacements or following in builder.targets():
            return
        if first_in_block and _leading_blanks(following):
            # It now opens its block: no blank line between `try:` and it.
            count = len(_leading_blanks(following))
            builder.replace(following, lambda updated: updated.with_changes(leading_lines=updated.leading_lines[count:]))
            return
        if not blanks or _leading_blanks(following):
            return

        def with_blanks(updated: cst.CSTNode) -> cst.CSTNode:
            return updated.with_changes(leading_lines=[*blanks, *updated.leading_lines])

        builder.replace(following, with_blanks)

    def closure(self) -> Set[cst.CSTNode]:
        """Removed nodes, grown upward: an `if`/`try` that loses its whole body goes as well."""
        removed = self._removed_small()
        changed = True
        while changed:
            changed = False
            for statement in list(removed):
                parent_line = self.names.parent(statement)
                candidates = [statement]
                if isinstance(parent_line, cst.SimpleStatementLine):
                    candidates.append(parent_line)
                for candidate in candidates:
                    block = containing_block(self.names, candidate) or self.names.parent(candidate)
                    if block is None or not self._block_emptied(block, removed):
                        continue
                    owner = self.names.parent(block)
                    if isinstance(owner, cst.Else) and owner not in removed:
                        # `else: amp = None` left empty: the `else` goes (the `if` may go next)
                        removed.add(owner)
                        changed = True
                    elif isinstance(owner, cst.If) and owner.body is block and owner.orelse in (None, *removed):
                        if owner not in removed and _is_statement(owner, self.names):
                            removed.add(owner)
                            changed = True
                    elif isinstance(owner, cst.Try) and owner.body is block and self._trivial_handlers(owner):
                        if owner not in removed:
                            removed.add(owner)
                            changed = True
        return removed

    def _trivial_handlers(self, node: cst.Try) -> bool:
        """Handlers that only provide the fallback of the removed import (or complain, or give up)."""
        if node.orelse is not None or node.finalbody is not None:
            return False
        for handler in node.handlers:
            body = body_of(handler.body)
            if body is None:
                body = [handler.body]
            for statement in body:
                if isinstance(statement, cst.SimpleStatementLine):
                    if not all(self._trivial_small(s) for s in statement.body):
                        return False
                elif isinstance(statement, cst.SimpleStatementSuite):
                    if not all(self._trivial_small(s) for s in statement.body):
                        return False
                else:
                    return False
        return True

    def _trivial_small(self, small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, (cst.Pass, cst.Raise, cst.Continue, cst.Break)):
            return True
        if isinstance(small, cst.Return):  # a handler that gives up (`return`, `return None`, `return 1`)
            return small.value is None or isinstance(small.value, (cst.Name, cst.Integer, cst.SimpleString))
        if isinstance(small, cst.Expr):  # print(...), logger.warning(...), warnings.warn(...), a docstring
            return isinstance(small.value, (cst.Call, cst.SimpleString, cst.ConcatenatedString))
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
            return all(isinstance(t, cst.Name) and t.value in self.fallback_names for t in targets) and isinstance(
                small.value, cst.Name
            ) and small.value.value in ("None", "False")
        return False

    def emit(
        self,
        builder: FixBuilder,
        replacements: Optional[Dict[cst.CSTNode, cst.CSTNode]] = None,
        *,
        import_torch: bool = False,
    ) -> Set[cst.CSTNode]:
        """Add the removals to `builder` (a removed statement in `replacements` is replaced
        instead); returns every node removed. With `import_torch`, the fix needs `import torch`:
        a removed top-level import line becomes it (so it lands where the apex import was),
        else the engine adds it."""
        replacements = dict(replacements or {})
        removed = self.closure()
        if import_torch:
            builder.require_import("torch")
        # Only the outermost removed nodes become changes.
        outermost = [n for n in removed if not any(a in removed for a in self.names.ancestors(n))]
        done: Set[cst.CSTNode] = set()
        for node in outermost:
            if isinstance(node, cst.BaseSmallStatement):
                line = self.names.parent(node)
                if isinstance(line, cst.SimpleStatementLine) and all(s in removed for s in line.body):
                    if line not in done:
                        if line in replacements:
                            builder.replace(line, replacements[line])
                        else:
                            builder.remove(line)
                            self._keep_blank_lines(builder, line, removed, replacements)
                        done.add(line)
                    continue
                builder.remove(node)
                done.add(node)
            elif node in replacements:
                builder.replace(node, replacements[node])
                done.add(node)
            else:
                builder.remove(node)
                done.add(node)
                self._keep_blank_lines(builder, node, removed, replacements)
        for node, aliases in self.aliases.items():
            if node in removed or any(a in removed for a in self.names.ancestors(node)):
                continue
            kept = [a for a in node.names if a not in aliases]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            builder.replace(node, node.with_changes(names=kept))
        return removed


def _leading_blanks(statement: cst.CSTNode) -> list:
    lines = list(getattr(statement, "leading_lines", ()) or ())
    count = 0
    while count < len(lines) and lines[count].comment is None:
        count += 1
    return lines[:count]


def _is_statement(node: cst.CSTNode, names: NameIndex) -> bool:
    return isinstance(names.parent(node), (cst.IndentedBlock, cst.Module))


def unused_after(names: NameIndex, binding: Binding, handled: Iterable[cst.CSTNode]) -> bool:
    """True when every reference to `binding` is among the `handled` nodes (or inside one)."""
    handled_set = set(handled)
    for ref in names.references(binding):
        if ref in handled_set:
            continue
        if any(a in handled_set for a in names.ancestors(ref)):
            continue
        return False
    return True


def none_assignments(statements: Iterable[cst.CSTNode], bound: Set[str]) -> List[cst.CSTNode]:
    """`name = None` / `name = False` small statements of `statements` for the names in `bound`."""
    found: List[cst.CSTNode] = []
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value in bound
                and isinstance(small.value, cst.Name)
                and small.value.value in ("None", "False")
            ):
                found.append(small)
    return found
