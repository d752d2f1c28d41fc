"""The `ast` screen of the Lightning precision rules (AMP405, AMP406): can some `precision`
setting of the file be followed to one of a few literals?

Both rules report only a `precision` setting (`_lightning.precision_settings`: a `precision=`
keyword of a call, or a `"precision"` entry of a dict spread into one with `**`) whose value the
follower (`analysis/values.Follower`, as `_frameworks.follow_setting` runs it) takes to such a
literal. This screen over-approximates that follower on the `ast`, without scopes:

- a constant is its own value (`ast` also folds `"1" "6"`; a superset of `literal_value`);
- `a if c else b`: both branches;
- a name `n`: every value assigned to a name `n` anywhere in the file (`n = v`, `n: T = v`,
  `a, n = x, v` element-wise, a chained `m = n = v`) and the default of every parameter named
  `n` (the follower takes only assignments, annotated assignments and a parameter's default);
- `x.attr`: what `x.attr` may be through `self.attr = v` (any `<anything>.attr = v`), a class
  body's `attr = v` (a dataclass field: the name `attr` above) or an argparse option, whose
  default is a `default=` keyword of some call (any call: a superset). An option without a
  default stands for False, True or None, never one of the literals asked about;
- anything else reaches no literal (the follower gives up on it: no source).

A file none of whose `precision` settings can reach one of the values cannot hold a finding of
either rule. `tests/test_precision_screen.py` checks this against the rules over whole trees.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Set, Tuple

from ampmigrate.engine.ast_nodes import memo, nodes_of  # memo: AMP405 and AMP406 screen one tree


class _Index:
    """The settings and the value sources of one tree, gathered from the shared node walk."""

    def __init__(self, tree: ast.AST) -> None:
        self.settings: List[ast.AST] = []  # values given to `precision`
        self.names: Dict[str, List[ast.AST]] = {}  # name -> values assigned to it
        self.attrs: Dict[str, List[ast.AST]] = {}  # attr -> values assigned to `<x>.attr`
        self.defaults: List[ast.AST] = []  # `default=` keyword values (argparse options)
        for call in nodes_of(tree, ast.Call):
            for keyword in call.keywords:
                if keyword.arg == "precision":
                    self.settings.append(keyword.value)
                elif keyword.arg == "default":
                    self.defaults.append(keyword.value)
        for display in nodes_of(tree, ast.Dict):
            for key, value in zip(display.keys, display.values):
                if isinstance(key, ast.Constant) and key.value == "precision":
                    self.settings.append(value)
        for assign in nodes_of(tree, ast.Assign):
            for target in assign.targets:
                self._assign(target, assign.value)
        for assign in nodes_of(tree, ast.AnnAssign):
            if assign.value is not None:
                self._assign(assign.target, assign.value)
        for kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
            for function in nodes_of(tree, kind):
                self._parameters(function.args)

    def _assign(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.names.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Attribute):
            self.attrs.setdefault(target.attr, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for element, element_value in zip(target.elts, value.elts):
                    self._assign(element, element_value)
            # else: the resolver binds no value to the names (the follower stops there)

    def _parameters(self, arguments: ast.arguments) -> None:
        positional = [*arguments.posonlyargs, *arguments.args]
        for argument, default in zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults):
            self.names.setdefault(argument.arg, []).append(default)
        for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
            if default is not None:
                self.names.setdefault(argument.arg, []).append(default)

    def reaches(self, value: ast.AST, wanted: Set[object]) -> bool:
        seen: Set[int] = set()
        stack = [value]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Constant):
                if _hashable_in(node.value, wanted):
                    return True
            elif isinstance(node, ast.IfExp):
                stack += (node.body, node.orelse)
            elif isinstance(node, ast.Name):
                stack += self.names.get(node.id, ())
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                stack += self.attrs.get(node.attr, ())
                stack += self.names.get(node.attr, ())
                stack += self.defaults
        return False


def precision_may_be(tree: ast.Module, values: Tuple[object, ...]) -> bool:
    """Whether some `precision` setting of `tree` may be followed to one of `values`."""
    index = memo(tree, "precision settings", _Index)
    wanted = set(values)
    return any(index.reaches(value, wanted) for value in index.settings)


def _hashable_in(value: object, wanted: Set[object]) -> bool:
    if isinstance(value, bool):  # the rules never take True/False for 16
        return False
    try:
        return value in wanted
    except TypeError:
        return False
