"""Is this code deliberately kept for older torch versions?

Code that chooses between the old and new API on the torch version (`if torch.__version__ <
...`, `_TORCH_GREATER_EQUAL_2_4`, `hasattr(torch.amp, "GradScaler")`) or on an import failing
(`try: from torch.amp import X / except ImportError: from torch.cuda.amp import X`) must not be
"fixed": the old branch is there on purpose. Rules report such code as informational instead.
"""

from __future__ import annotations

import re
import weakref
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampmigrate.engine.cst_walk import walk
from ampmigrate.engine.names import NameIndex, dotted

# Identifiers that name a version or a version comparison: TORCH_VERSION, _TORCH_GREATER_EQUAL_2_4,
# is_torch_greater_or_equal_than_2_4, torch_version, PT_VERSION, _IS_TORCH_GE_2_3, ...
_VERSIONISH = re.compile(
    r"version|(^|_)(ge|gt|le|lt|geq|leq|greater|less|older|newer)(_|$)|_\d+_\d+|torch\d|(^|_)pt\d",
    re.IGNORECASE,
)
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception"}


def mentions_version(names: NameIndex, expression: cst.CSTNode) -> bool:
    """True when a condition compares versions or probes for an API with hasattr."""
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            nonlocal found
            if _VERSIONISH.search(node.value):
                found = True

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            if isinstance(node.func, cst.Name) and node.func.value == "hasattr" and node.args:
                target = names.qualified_names(node.args[0].value)
                if any(q == "torch" or q.startswith("torch.") for q in target):
                    found = True

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            nonlocal found
            if re.fullmatch(r"[rbuRBU]*['\"]\d+\.\d+(\.\d+)?['\"]", node.value):
                found = True  # compared against a literal version such as "2.4"

    walk(expression, _Finder())
    return found


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    for kind in kinds:
        expression = kind.value if isinstance(kind, cst.Element) else kind
        if isinstance(expression, cst.Name) and expression.value in _IMPORT_ERRORS:
            return True
    return False


def _terminates(block: cst.BaseSuite) -> bool:
    """The block leaves with the new API's result. A `raise` does not count: `if <too old>: raise
    ImportError(...)` rejects old versions, so nothing after it is kept for them."""
    body = block.body
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        return any(isinstance(s, (cst.Return, cst.Continue, cst.Break)) for s in last.body)
    return False


def _early_return_guard(names: NameIndex, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    """`if <version check>: return new` earlier in the same block guards what follows it."""
    block = names.parent(statement)
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)):
        return None
    # The first guard of each block, found once: asked for every statement of a block, a scan
    # of the siblings before it each time is quadratic in a long module.
    guards = _FIRST_GUARDS.setdefault(names, {})
    key = id(block)
    if key not in guards:
        first = next(
            (
                (index, sibling)
                for index, sibling in enumerate(body)
                if isinstance(sibling, cst.If) and _terminates(sibling.body) and mentions_version(names, sibling.test)
            ),
            None,
        )
        guards[key] = None if first is None else (first[0], first[1], {id(s): i for i, s in enumerate(body)})
    found = guards[key]
    if found is None:
        return None
    index, guard, positions = found
    return guard if positions.get(id(statement), -1) > index else None


_Guard = Optional[Tuple[int, cst.If, Dict[int, int]]]  # (its index, the `if`, statement positions)
_FIRST_GUARDS: "weakref.WeakKeyDictionary[NameIndex, Dict[int, _Guard]]" = weakref.WeakKeyDictionary()


def version_gate(names: NameIndex, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The `if`/ternary/`try` that makes `node` a deliberate compatibility branch, if any."""
    child: cst.CSTNode = node
    for ancestor in names.ancestors(node):
        if isinstance(child, cst.BaseStatement):
            guard = _early_return_guard(names, child)
            if guard is not None:
                return guard
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and child is not ancestor.test:
            if mentions_version(names, ancestor.test):
                return ancestor
            # `elif` chains: the conditions of the enclosing `if`s count as well.
            parent = names.parent(ancestor)
            while isinstance(parent, cst.If) and parent.orelse is ancestor:
                if mentions_version(names, parent.test):
                    return parent
                ancestor, parent = parent, names.parent(parent)
        if isinstance(ancestor, cst.ExceptHandler) and _catches_import_error(ancestor):
            return ancestor  # the fallback branch of a try-import
        child = ancestor
    return None


def _branches(gate: cst.CSTNode) -> List[cst.CSTNode]:
    """The alternatives a gate chooses between: an `if`/`elif`/`else` chain's bodies, a
    ternary's two values, a `try`'s body and its handlers."""
    if isinstance(gate, cst.IfExp):
        return [gate.body, gate.orelse]
    if isinstance(gate, cst.If):
        found: List[cst.CSTNode] = []
        node: Optional[cst.CSTNode] = gate
        while isinstance(node, cst.If):
            found.append(node.body)
            node = node.orelse
        if isinstance(node, cst.Else):
            found.append(node.body)
        return found
    if isinstance(gate, cst.Try):
        return [gate.body, *gate.handlers]
    return []


def _top_if(names: NameIndex, gate: cst.If) -> cst.If:
    parent = names.parent(gate)
    while isinstance(parent, cst.If) and parent.orelse is gate:
        gate, parent = parent, names.parent(parent)
    return gate


def _feature_probe(names: NameIndex, test: cst.CSTNode, is_modern: Callable[[str], bool]) -> bool:
    """`hasattr(torch.amp, "GradScaler")`, `hasattr(torch, "autocast")`: a probe for the modern API."""
    for node in _walk(test):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "hasattr":
            if len(node.args) == 2 and isinstance(node.args[1].value, cst.SimpleString):
                attribute = node.args[1].value.evaluated_value
                if any(is_modern(f"{q}.{attribute}") or is_modern(q) for q in names.qualified_names(node.args[0].value)):
                    return True
    return False


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _holds_modern(names: NameIndex, branch: cst.CSTNode, is_modern: Callable[[str], bool]) -> bool:
    for node in _walk(branch):
        if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
            module = dotted(node.module) or ""
            aliases = node.names if not isinstance(node.names, cst.ImportStar) else ()
            if is_modern(module) or any(is_modern(f"{module}.{dotted(a.name)}") for a in aliases):
                return True
        elif isinstance(node, cst.Import):
            if any(is_modern(dotted(a.name) or "") for a in node.names):
                return True
        elif isinstance(node, (cst.Name, cst.Attribute)):
            if any(is_modern(q) for q in names.qualified_names(node)):
                return True
    return False


def chooses_modern(names: NameIndex, gate: cst.CSTNode, node: cst.CSTNode, is_modern: Callable[[str], bool]) -> bool:
    """Whether `gate` (from `version_gate(names, node)`) chooses between the legacy spelling at
    `node` and the modern API: another branch holds the modern API, or the condition probes for
    it. A version check that chooses between mixed precision and none is not such a choice."""
    if isinstance(gate, cst.ExceptHandler):
        gate = names.parent(gate)  # the `try` whose body the handler is the fallback of
    elif isinstance(gate, cst.If):
        if _terminates(gate.body) and not any(a is gate for a in names.ancestors(node)):
            # an early-return guard: the code after it is the other branch
            return _holds_modern(names, gate.body, is_modern) or _feature_probe(names, gate.test, is_modern)
        gate = _top_if(names, gate)
    tests = []
    current: Optional[cst.CSTNode] = gate
    while isinstance(current, cst.If):
        tests.append(current.test)
        current = current.orelse
    if isinstance(gate, (cst.IfExp, cst.While)):
        tests.append(gate.test)
    if any(_feature_probe(names, test, is_modern) for test in tests):
        return True
    others = [b for b in _branches(gate) if not (b is node or any(a is b for a in names.ancestors(node)))]
    return any(_holds_modern(names, branch, is_modern) for branch in others)
