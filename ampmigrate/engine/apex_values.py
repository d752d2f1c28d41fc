"""apex's amp module reached through a value: the `ast` facts the project index keeps.

Real apex code does not always name apex where it uses it. A helper imports the module and
returns it (nlp-recipes' `get_amp(fp16)`: `from apex import amp` under `if fp16:`, else
`amp = None`, then `return amp`), and training code elsewhere runs `amp = get_amp(fp16)` and
`amp.initialize(...)`. The helper's file records the function here (`apex_amp_getters`); the
rule (rules/apex/amp_from_helper.py) reports the uses of what a call of it returns.

A getter is recorded only when every value it can return is apex's amp module or `None`: every
`return` (of the function itself, not of a nested one) returns `None` or a name that the
function binds only by importing apex's amp or by assigning `None`, at least one return is the
module, and the function neither yields nor declares the name `global`/`nonlocal`.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set

import ast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def apex_amp_getters(tree: ast.Module) -> List[str]:
    """Top-level functions of `tree` whose every return value is apex's amp module or None."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _returns_apex_amp(node):
            found.append(node.name)
    return found


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `function`'s body, not descending into nested functions, lambdas, classes."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _returns_apex_amp(function: ast.AST) -> bool:
    # What each name of the function is bound to: "amp" (apex's module), "none", or "other".
    kinds: Dict[str, Set[str]] = {}
    returns: List[Optional[ast.expr]] = []
    params = function.args
    for arg in [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]:
        if arg is not None:
            kinds.setdefault(arg.arg, set()).add("other")
    for node in _own_nodes(function):
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)):
            return False
        if isinstance(node, _SCOPES) and not isinstance(node, ast.Lambda):
            kinds.setdefault(node.name, set()).add("other")
        elif isinstance(node, ast.Return):
            returns.append(node.value)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                amp = node.module == "apex" and not node.level and alias.name == "amp"
                kinds.setdefault(alias.asname or alias.name, set()).add("amp" if amp else "other")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                amp = alias.name == "apex.amp" and alias.asname is not None
                kinds.setdefault(alias.asname or alias.name.split(".")[0], set()).add("amp" if amp else "other")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            kinds.setdefault(node.id, set()).add("other")
        elif isinstance(node, ast.Assign) and _is_none(node.value):
            # `amp = None`: its target is also seen as a Store below; mark the value here.
            for target in node.targets:
                if isinstance(target, ast.Name):
                    kinds.setdefault(target.id, set()).add("none")
    # A `name = None` assignment's target was also recorded as "other" by its Store: take the
    # assignments of None back out (each Store of such a name must be one of them).
    stores: Dict[str, int] = {}
    nones: Dict[str, int] = {}
    for node in _own_nodes(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.Assign) and _is_none(node.value) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                nones[target.id] = nones.get(target.id, 0) + 1
    for name, count in nones.items():
        if stores.get(name) == count and name in kinds:
            kinds[name].discard("other")
    module_returned = False
    for value in returns:
        if value is None or _is_none(value):
            continue
        if not isinstance(value, ast.Name):
            return False
        bound = kinds.get(value.id)
        if not bound or "other" in bound or "amp" not in bound:
            return False
        module_returned = True
    return module_returned


def _is_none(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
