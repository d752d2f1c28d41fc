"""Is this code deliberately kept for older torch versions?

Code that chooses between the old and new API on the torch version (`if torch.__version__ <
...`, `_TORCH_GREATER_EQUAL_2_4`, `hasattr(torch.amp, "GradScaler")`) or on an import failing
(`try: from torch.amp import X / except ImportError: from torch.cuda.amp import X`) must not be
"fixed": the old branch is there on purpose. Rules report such code as informational instead.
"""

from __future__ import annotations

import re
import weakref
from typing import Dict, Optional, Tuple

import libcst as cst

from ampmigrate.engine.cst_walk import walk
from ampmigrate.engine.names import NameIndex

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
    body = block.body
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        return any(isinstance(s, (cst.Return, cst.Raise, cst.Continue, cst.Break)) for s in last.body)
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
