"""apex's amp module stored in an attribute by another file (issue 12: amp passed as a value).

argus-style trainers keep apex behind an attribute: the model class sets `self.amp = None` in
`__init__` and runs `with self.amp.scale_loss(loss, self.optimizer) as scaled_loss:` in
`train_step`; a helper of another file (`initialize_amp(model)`) runs `from apex import amp`,
`amp.initialize(...)` and `model.amp = amp`. The class's file never names apex.

The index records, per file, what each attribute whose name contains `amp` is assigned
(`apex_attr_stores`): "apex" (a name bound there only by apex amp imports, and None),
"none", or "other" (any other value, a tuple target without a matching value, an augmented
assignment, a `del`, a store in a `for` or `with` target, a class-level name of a class body);
a `setattr(x, name, v)` whose name is not a string constant records "*" (any attribute).
`ProjectIndex.apex_attr(attr)` names a file storing apex's module when no file of the run stores
anything else there (nor sets attributes dynamically): then every `<x>.<attr>` of the run is
apex's module or None, whatever `x` is. rules/apex/amp_attribute.py reports the apex calls on it.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Set, Tuple

from ampmigrate.engine.apex_values import _only_apex_amp, _own_nodes, _pairs, name_scopes
from ampmigrate.engine.ast_nodes import walk_order

# A store to an attribute named like amp (`.amp =`, `.amp,` in a tuple target, `.amp)`):
# the files worth parsing; `setattr(` too.
_AMP_ATTR_STORE = re.compile(rb"\.[ \t]*\w*amp\w*[ \t]*(?:=(?!=)|,|\)|\])")


# `<x>.<attr named like amp>.<apex.amp function>` read anywhere in a file's bytes but a comment
# (strings too: a spurious record only makes a migration more careful; commented-out code, as
# RetinaNet's `# with self.amp.scale_loss(...)`, never runs).
_AMP_ATTR_LOAD = re.compile(
    rb"\.[ \t]*(\w*amp\w*)[ \t]*\.[ \t]*(?:scale_loss|master_params|state_dict|load_state_dict|initialize|_amp_state)\b"
)


def apex_attr_loads(raw: bytes) -> List[str]:
    """The attributes named like amp that the file reads an apex.amp function from."""
    found = set()
    for match in _AMP_ATTR_LOAD.finditer(raw):
        line_start = raw.rfind(b"\n", 0, match.start()) + 1
        if b"#" not in raw[line_start : match.start()]:
            found.add(match.group(1).decode("ascii", "replace"))
    return sorted(found)


def wanted(raw: bytes) -> bool:
    """Whether the file may hold a record (a cheap byte test before any parse)."""
    return (b"amp" in raw and _AMP_ATTR_STORE.search(raw) is not None) or b"setattr(" in raw


def _followed(attr: str) -> bool:
    return "amp" in attr


def apex_attr_stores(tree: ast.Module) -> Dict[str, List[str]]:
    """{attribute: sorted kinds stored there} for the attributes named like amp ("*": any)."""
    found: Dict[str, Set[str]] = {}
    handled: Set[int] = set()
    everything = walk_order(tree)  # ast.walk's nodes, in its order
    for nodes, resolve in _scopes(tree, everything):
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for element, value in _pairs(target, node.value):
                        if isinstance(element, ast.Attribute) and _followed(element.attr):
                            handled.add(id(element))
                            if isinstance(value, ast.Constant) and value.value is None:
                                kind = "none"
                            elif isinstance(value, ast.Name) and _only_apex_amp(resolve(value.id)):
                                kind = "apex"
                            else:
                                kind = "other"
                            found.setdefault(element.attr, set()).add(kind)
    for node in everything:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _followed(node.attr):
            if id(node) not in handled:
                found.setdefault(node.attr, set()).add("other")
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:  # `amp = None` in a class body: a class attribute
                for target, kind in _class_targets(statement):
                    if _followed(target):
                        found.setdefault(target, set()).add(kind)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if _followed(name.value):
                    found.setdefault(name.value, set()).add("other")
            else:
                found.setdefault("*", set()).add("other")
    return {attr: sorted(kinds) for attr, kinds in sorted(found.items())}


def _scopes(tree: ast.Module, everything: List[ast.AST]):
    """What `apex_attr_stores` reads of `name_scopes(tree)`, the costly part of it: nothing where
    no assignment stores to an attribute named like amp (an assignment's attribute targets are
    such stores; the byte test passes many files without: `.timestamp)`, `.sample,` in a call's
    arguments); the scopes without their names' kinds where no import of the file binds apex's
    amp (no name can resolve to it then: every name's kinds lack "amp")."""
    if not any(
        isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _followed(node.attr)
        for node in everything
    ):
        return []
    if any(imports_apex_amp(node) for node in everything):
        return name_scopes(tree)
    functions = [node for node in everything if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [(list(_own_nodes(scope)), _no_kinds) for scope in (tree, *functions)]


def imports_apex_amp(node: ast.AST) -> bool:
    """An import `binding_kinds` reads as binding apex's amp module."""
    if isinstance(node, ast.ImportFrom):
        return node.module == "apex" and not node.level and any(alias.name == "amp" for alias in node.names)
    if isinstance(node, ast.Import):
        return any(alias.name == "apex.amp" and alias.asname is not None for alias in node.names)
    return False


def _no_kinds(name: str) -> Set[str]:
    return set()


def _class_targets(statement: ast.stmt) -> List[Tuple[str, str]]:
    """(name, "none" | "other") for each name a class-body statement assigns."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return []
    value = getattr(statement, "value", None)
    none = isinstance(statement, ast.Assign) and isinstance(value, ast.Constant) and value.value is None
    return [
        (n.id, "none" if none and isinstance(t, ast.Name) else "other")
        for t in targets
        for n in ast.walk(t)
        if isinstance(n, ast.Name)
    ]
