"""Checkpoint loaders that take the objects to restore as keyword arguments: the `ast` fact the
project index keeps.

SwAV's `restart_from_checkpoint(path, run_variables=..., state_dict=model, optimizer=optimizer,
amp=apex.amp)` (and its many forks) restores every keyword argument from the checkpoint entry of
the same name: `for key, value in kwargs.items(): if key in checkpoint and value is not None:
value.load_state_dict(checkpoint[key])`. Such a loader treats each value only as an object with
`load_state_dict`, so a GradScaler can take apex's amp module's place there
(rules/apex/_state_loader_args.py).

A loader is recorded when the function (top level) takes `**kwargs` and uses it only as the
iterable of `for <key>, <value> in kwargs.items():`, where `<value>` is only the receiver of
`.load_state_dict(...)` or compared with `is None` / `is not None`.
"""

from __future__ import annotations

import ast
from typing import List

from ampmigrate.engine.apex_values import _own_nodes


def state_loaders(tree: ast.Module) -> List[str]:
    """The top-level functions of `tree` that restore each keyword argument's state."""
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _restores_kwargs(node)
    ]


def _restores_kwargs(function: ast.AST) -> bool:
    kwargs = function.args.kwarg.arg if function.args.kwarg is not None else None
    if kwargs is None:
        return False
    own = list(_own_nodes(function))
    loops = []
    for node in own:
        if isinstance(node, ast.Name) and node.id == kwargs and not _is_items_loop_iterable(node, own):
            return False  # kwargs used otherwise (passed on, indexed, rebound)
        if isinstance(node, ast.For) and _items_of(node.iter) == kwargs:
            loops.append(node)
    if not loops:
        return False
    restores = False
    for loop in loops:
        if not (isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2 and isinstance(loop.target.elts[1], ast.Name)):
            return False
        value = loop.target.elts[1].id
        parents = {id(child): parent for parent in ast.walk(loop) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(loop):
            if not (isinstance(node, ast.Name) and node.id == value) or node is loop.target.elts[1]:
                continue
            parent = parents.get(id(node))
            if isinstance(parent, ast.Attribute) and parent.attr == "load_state_dict" and isinstance(parents.get(id(parent)), ast.Call):
                restores = True
                continue
            if isinstance(parent, ast.Compare) and len(parent.ops) == 1 and isinstance(parent.ops[0], (ast.Is, ast.IsNot)):
                other = parent.comparators[0] if parent.left is node else parent.left
                if isinstance(other, ast.Constant) and other.value is None:
                    continue
            return False  # the value is used otherwise (stored, passed, rebound)
    return restores


def _items_of(node: ast.AST):
    """`x.items()` -> "x"."""
    if (
        isinstance(node, ast.Call) and not node.args and not node.keywords
        and isinstance(node.func, ast.Attribute) and node.func.attr == "items" and isinstance(node.func.value, ast.Name)
    ):
        return node.func.value.id
    return None


def _is_items_loop_iterable(name: ast.Name, own) -> bool:
    return any(isinstance(node, ast.For) and _items_of(node.iter) == name.id and node.iter.func.value is name for node in own)
