"""Turning fixes into new source text.

A round applies every applicable, non-overlapping fix with one CST transform (two fixes overlap
when a node one of them replaces contains, or is, a node the other replaces; the later one waits
for the next round, where it is recomputed against the new code). The caller re-runs the rules
on the result until nothing changes: one rule's output can then be improved by another.
"""

from __future__ import annotations

import ast
import bisect
import difflib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.diagnostics import Edit, Fix, Location
from ampmigrate.engine.names import NameIndex
from ampmigrate.source import line_starts, split_lines

_MISSING = object()


class _ApplyChanges(cst.CSTTransformer):
    def __init__(self, replacements: Dict[cst.CSTNode, Any]) -> None:
        super().__init__()
        self.replacements = replacements
        self.produced: Dict[cst.CSTNode, Any] = {}  # what each replaced node became

    def on_leave(self, original_node, updated_node):
        replacement = self.replacements.get(original_node, _MISSING)
        if replacement is not _MISSING:
            if callable(replacement):
                # Computed from the node as the other changes of the round left it.
                result = replacement(updated_node)
            elif isinstance(replacement, cst.FlattenSentinel):
                # Statements inserted around a node keep the changes made inside it.
                result = cst.FlattenSentinel(
                    [updated_node if item is original_node else item for item in replacement.nodes]
                )
            else:
                result = replacement
            self.produced[original_node] = result
            return result
        if isinstance(updated_node, (cst.IndentedBlock, cst.Module)):
            updated_node = self._keep_separation(original_node, updated_node)
            updated_node = self._keep_footer_comments(original_node, updated_node)
        if isinstance(updated_node, cst.IndentedBlock) and not updated_node.body and original_node.body:
            # Every statement of the block was removed: Python needs one.
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node

    def _keep_separation(self, original_node, updated_node):
        """A removed statement's leading blank lines go to the next statement (when it has none),
        so removing `scaler = GradScaler()` after a blank line does not glue two paragraphs."""
        body = list(updated_node.body)
        expected = 0
        for statement in original_node.body:
            replacement = self.replacements.get(statement, _MISSING)
            if replacement is not cst.RemovalSentinel.REMOVE:
                expected += len(replacement.nodes) if isinstance(replacement, cst.FlattenSentinel) else 1
        if expected != len(body) or expected == len(original_node.body):
            return updated_node  # nothing removed here, or removed some other way: leave it
        index, pending, changed = 0, None, False
        for statement in original_node.body:
            replacement = self.replacements.get(statement, _MISSING)
            if replacement is cst.RemovalSentinel.REMOVE:
                pending = pending or _leading_blanks(statement)
                continue
            if pending and index < len(body) and not _leading_blanks(body[index]):
                body[index] = body[index].with_changes(leading_lines=[*pending, *body[index].leading_lines])
                changed = True
            pending = None
            index += len(replacement.nodes) if isinstance(replacement, cst.FlattenSentinel) else 1
        return updated_node.with_changes(body=body) if changed else updated_node


    def _keep_footer_comments(self, original_node, updated_node):
        """A compound statement rewritten into simple ones (`with amp.scale_loss(...) as s:` into
        `scaler.scale(loss).backward()`) loses the comments below the last statement of its body
        (LibCST keeps them in the body's footer): they go before the statement that followed it,
        or to the end of the block."""
        body = list(updated_node.body)
        counts = []
        for statement in original_node.body:
            result = self.produced.get(statement, _MISSING)
            counts.append(
                1 if result is _MISSING else 0 if result is cst.RemovalSentinel.REMOVE
                else len(result.nodes) if isinstance(result, cst.FlattenSentinel) else 1
            )
        if sum(counts) != len(body):
            return updated_node
        index, carry, changed = 0, [], False
        for statement, count in zip(original_node.body, counts):
            if carry and count:
                body[index] = body[index].with_changes(leading_lines=[*carry, *body[index].leading_lines])
                carry, changed = [], True
            result = self.produced.get(statement, _MISSING)
            if result is not _MISSING and result is not cst.RemovalSentinel.REMOVE:
                carry = _lost_footer(statement, body[index:index + count])
            index += count
        if carry:
            updated_node = updated_node.with_changes(footer=[*updated_node.footer, *carry])
            changed = True
        return updated_node.with_changes(body=body) if changed else updated_node


def _lost_footer(statement: cst.CSTNode, emitted: Sequence[cst.CSTNode]) -> List[cst.EmptyLine]:
    """The footer lines of `statement`'s own body, from its first comment to its last, when no
    statement it became still holds those comments."""
    block = getattr(statement, "body", None)
    footer = list(getattr(block, "footer", ()) or ()) if isinstance(block, cst.IndentedBlock) else []
    marks = [i for i, line in enumerate(footer) if line.comment is not None]
    if not marks:
        return []
    kept = "".join(cst.Module(body=[]).code_for_node(node) for node in emitted)
    lines = footer[marks[0]: marks[-1] + 1]
    if all(line.comment is None or line.comment.value in kept for line in lines):
        return []
    return lines


def _leading_blanks(statement: cst.CSTNode) -> List[cst.EmptyLine]:
    """The blank lines (no comment) at the start of a statement's leading lines."""
    blanks: List[cst.EmptyLine] = []
    for line in getattr(statement, "leading_lines", ()):
        if line.comment is not None:
            break
        blanks.append(line)
    return blanks


def select_compatible(fixes: Sequence[Fix], names: NameIndex) -> List[Fix]:
    """The fixes (in order) that touch disjoint subtrees; the rest wait for a later round."""
    claimed: Set[cst.CSTNode] = set()
    claimed_ancestors: Set[cst.CSTNode] = set()
    accepted: List[Fix] = []
    for fix in fixes:
        targets = [target for target, _ in fix.changes]
        lineages = [list(names.ancestors(target)) for target in targets]
        clash = any(
            target in claimed or target in claimed_ancestors or any(a in claimed for a in lineage)
            for target, lineage in zip(targets, lineages)
        )
        if clash or not targets and not fix.imports:
            continue
        accepted.append(fix)
        claimed.update(targets)
        for lineage in lineages:
            claimed_ancestors.update(lineage)
    return accepted


def apply_fixes(module: cst.Module, fixes: Iterable[Fix]) -> str:
    """The module's code with `fixes` (already known to be disjoint) applied."""
    replacements: Dict[cst.CSTNode, Any] = {}
    imports: List[str] = []
    for fix in fixes:
        replacements.update(fix.changes)
        imports.extend(m for m in fix.imports if m not in imports)
    new_module = module.visit(_ApplyChanges(replacements)) if replacements else module
    if imports:
        new_module = add_imports(new_module, imports)
    return new_module.code


def add_imports(module: cst.Module, modules: Sequence[str]) -> cst.Module:
    """Add `import X` for each module not already imported at the top level."""
    bound = _top_level_imports(module)
    missing = [m for m in modules if m not in bound]
    if not missing:
        return module
    body = list(module.body)
    index = _import_insertion_index(body)
    new = [cst.SimpleStatementLine([cst.Import([cst.ImportAlias(cst.parse_expression(m))])]) for m in missing]
    if index < len(body) and index == _header_end(body):
        # No import block to join. A licence header or comment block stays above the new import
        # (with the blank lines that followed it), a docstring or `__future__` import gets one
        # blank line after it, and the code that follows keeps its blank lines (or gets one).
        first = body[index]
        lines = list(first.leading_lines)
        last_comment = max((i for i, line in enumerate(lines) if line.comment is not None), default=-1)
        header, blank = lines[: last_comment + 1], lines[last_comment + 1 :]
        if header:
            lead = header + blank
        elif index > 0 and blank:  # after a docstring or `__future__` import: one blank line
            lead = [cst.EmptyLine()]
        else:
            lead = []
        new[0] = new[0].with_changes(leading_lines=lead)
        body[index] = first.with_changes(leading_lines=blank or [cst.EmptyLine()])
    body[index:index] = new
    return module.with_changes(body=body)


def _top_level_imports(module: cst.Module) -> Set[str]:
    bound: Set[str] = set()
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        if alias.asname is None:
                            bound.add(module.code_for_node(alias.name).split(".")[0])
    return bound


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future_import(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and all(isinstance(s, cst.ImportFrom) for s in statement.body)
        and all(
            isinstance(s.module, cst.Name) and s.module.value == "__future__" for s in statement.body
        )
    )


def _header_end(body: Sequence[cst.BaseStatement]) -> int:
    index = 0
    if body and _is_docstring(body[0]):
        index = 1
    while index < len(body) and _is_future_import(body[index]):
        index += 1
    return index


def _import_insertion_index(body: Sequence[cst.BaseStatement]) -> int:
    """After the leading block of imports (after the docstring and `__future__` imports)."""
    index = _header_end(body)
    end = index
    while end < len(body) and _is_import_line(body[end]):
        end += 1
    return end


def splice(original: str, rendered: str, changed: str) -> Optional[str]:
    """Carry the change `rendered` -> `changed` over to `original`, the text that was parsed.

    libcst renders almost every module exactly as it was read (`rendered == original`), but not
    all: a form feed before the first statement, or the last line break of a file with CR-only
    line endings, are dropped. Where that happens, the fix is applied to the original text
    instead, as long as the change and the difference are apart; otherwise None (not fixable).
    """
    if rendered == original:
        return changed
    if changed == rendered:
        return original
    # The gap: where the rendering differs from the original (one region).
    gap_start = _shared_prefix(original, rendered)
    gap_end = len(rendered) - _shared_suffix(original, rendered, min(len(original), len(rendered)) - gap_start)
    # The change: where the fix differs from the rendering (one region, as a hull).
    change_start = _shared_prefix(rendered, changed)
    kept_tail = _shared_suffix(rendered, changed, min(len(rendered), len(changed)) - change_start)
    change_end = len(rendered) - kept_tail
    if change_end <= gap_start:
        return changed[: len(changed) - kept_tail] + original[change_end:]
    if change_start >= gap_end:
        return original[: len(original) - (len(rendered) - change_start)] + changed[change_start:]
    return None


def _shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over slices: fast on large files)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _shared_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix, at most `limit`."""
    low, high = 0, max(0, min(limit, len(a), len(b)))
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle : len(a) - low] == b[len(b) - middle : len(b) - low]:
            low = middle
        else:
            high = middle - 1
    return low


# ---------------------------------------------------------------------------------- validation
def parses(code: str) -> bool:
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError:
        return False
    return True


def compiles(code: str) -> bool:
    """True when CPython (this interpreter) accepts the code, or cannot judge it at all."""
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    except (ValueError, MemoryError, RecursionError):
        return True
    return True


# ---------------------------------------------------------------------------------- text edits
def text_edits(old: str, new: str) -> Tuple[Edit, ...]:
    """Minimal edits (per changed line run, trimmed to the changed characters) from old to new."""
    old_lines = split_lines(old, keepends=True)
    new_lines = split_lines(new, keepends=True)
    starts = line_starts(old)
    offsets = [0]
    for line in old_lines:
        offsets.append(offsets[-1] + len(line))
    edits: List[Edit] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        start, end = offsets[i1], offsets[i2]
        before, after = old[start:end], "".join(new_lines[j1:j2])
        prefix = _common_prefix(before, after)
        suffix = _common_suffix(before[prefix:], after[prefix:])
        start_offset, end_offset = start + prefix, end - suffix
        content = after[prefix : len(after) - suffix]
        edits.append(Edit(_location(starts, start_offset), _location(starts, end_offset), content))
    return tuple(edits)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def _location(starts: Sequence[int], offset: int) -> Location:
    """1-based row and column of `offset`, given the offsets where lines start."""
    row = bisect.bisect_right(starts, offset)
    return Location(row, offset - starts[row - 1] + 1)


def fix_signature(module: cst.Module, fix: Fix) -> Tuple[str, Tuple[str, ...]]:
    """Identifies a fix across rounds (nodes change identity when the file is re-parsed)."""
    return fix.message, tuple(module.code_for_node(t) for t, _ in fix.changes)
