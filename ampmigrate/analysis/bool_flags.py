"""Whether a condition the apex migration writes into `enabled=` is a bool.

`torch.autocast(..., enabled=x)` raises `TypeError` unless `x` is a bool (torch/amp/autocast_mode.py
hands it to `torch.set_autocast_enabled`), and `GradScaler(enabled=x)` keeps `x` as it is, so
`torch.autocast(..., enabled=scaler.is_enabled())` raises on it too. apex took any truthy value:
`if args.amp:` with `--amp` an int (`type=int`, XLM's `--amp -1`), a YAML `is_apex: 0`
(intra_batch), a config lookup. The migration writes `bool(x)` for every conjunct not shown to be
a bool: a comparison, `not`, a bool literal, a call that answers a bool, or a name the file itself
binds to bools only (an argparse `store_true`/`store_false` option, a parameter whose default is
True/False, assignments of such values); `args.fp16` with its parser in another file, or a
parameter without a default, gets `bool(...)` (harmless where it was a bool already).

The evidence is per file and by the name's last part (`args.fp16`, `self.fp16` and `fp16` all ask
about `fp16`); one binding of that name to anything else spoils it.
"""

from __future__ import annotations

import ast
from typing import FrozenSet, Optional, Set

import libcst as cst

# Calls that answer a bool whatever their receiver (`torch.cuda.is_available()`,
# `scaler.is_enabled()`, `name.startswith("O")`).
_BOOL_METHODS = frozenset({"is_enabled", "is_available", "is_bf16_supported", "startswith", "endswith", "isdigit", "is_initialized"})
_BOOL_FUNCTIONS = frozenset({"bool", "isinstance", "issubclass", "hasattr", "callable", "all", "any"})
_BOOL_ACTIONS = frozenset({"store_true", "store_false"})


def bool_names(text: str) -> FrozenSet[str]:
    """The names (last parts) the file binds to bools only; empty when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset()
    good: Set[str] = set()
    spoiled: Set[str] = set()
    pending = []  # (name, value): bool when the value is, decided once the rest is known
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            dest = _option_dest(node)
            if dest is not None:
                action = _keyword_constant(node, "action")
                kind = _keyword(node, "type")
                is_bool = action in _BOOL_ACTIONS or (isinstance(kind, ast.Name) and kind.id == "bool")
                (good if is_bool else spoiled).add(dest)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            for arg, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
                if default is not None and isinstance(default, ast.Constant) and isinstance(default.value, bool):
                    good.add(arg.arg)
                else:
                    spoiled.add(arg.arg)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for target in targets:
                for name in _target_names(target):
                    if isinstance(node, ast.AugAssign) or value is None:
                        spoiled.add(name)
                    else:
                        pending.append((name, value))
        elif isinstance(node, (ast.For, ast.comprehension, ast.With, ast.AsyncFor)):
            targets = [node.target] if not isinstance(node, ast.With) else [i.optional_vars for i in node.items if i.optional_vars]
            for target in targets:
                spoiled.update(_target_names(target))
    changed = True
    while changed:  # `self.fp16 = fp16` is a bool when the parameter is
        changed = False
        for name, value in pending:
            if name in spoiled:
                continue
            if _is_bool_ast(value, good - spoiled):
                if name not in good:
                    good.add(name)
                    changed = True
    for name, value in pending:
        if not _is_bool_ast(value, good - spoiled):
            spoiled.add(name)
    return frozenset(good - spoiled)


def is_bool(expression: cst.BaseExpression, names: FrozenSet[str]) -> bool:
    """Whether the condition is a bool: by its form, or a name the file binds to bools only."""
    if isinstance(expression, (cst.Comparison,)):
        return True
    if isinstance(expression, cst.UnaryOperation):
        return isinstance(expression.operator, cst.Not)
    if isinstance(expression, cst.BooleanOperation):
        return is_bool(expression.left, names) and is_bool(expression.right, names)
    if isinstance(expression, cst.Name) and expression.value in ("True", "False"):
        return True
    last = _last_part(expression)
    if last is not None:
        return last in names
    if isinstance(expression, cst.Call):
        func = expression.func
        if isinstance(func, cst.Name):
            return func.value in _BOOL_FUNCTIONS
        return isinstance(func, cst.Attribute) and func.attr.value in _BOOL_METHODS
    return False


def _last_part(expression: cst.BaseExpression) -> Optional[str]:
    if isinstance(expression, cst.Name):
        return expression.value
    if isinstance(expression, cst.Attribute):
        return expression.attr.value
    if isinstance(expression, cst.Subscript):
        return ""  # a lookup (`config["fp16"]`): whatever the mapping holds
    return None


def _option_dest(call: ast.Call) -> Optional[str]:
    dest = _keyword_constant(call, "dest")
    if isinstance(dest, str):
        return dest
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [o for o in options if o.startswith("--")]
    chosen = long[0] if long else (options[0] if options else None)
    if chosen is None:
        return None
    return chosen.lstrip("-").replace("-", "_")


def _keyword(call: ast.Call, name: str) -> Optional[ast.expr]:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _keyword_constant(call: ast.Call, name: str):
    value = _keyword(call, name)
    return value.value if isinstance(value, ast.Constant) else None


def _target_names(target: ast.expr):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Attribute):
        yield target.attr
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _is_bool_ast(value: ast.expr, names: Set[str]) -> bool:
    if isinstance(value, ast.Constant):
        return isinstance(value.value, bool)
    if isinstance(value, ast.Compare):
        return True
    if isinstance(value, ast.UnaryOp):
        return isinstance(value.op, ast.Not)
    if isinstance(value, ast.BoolOp):
        return all(_is_bool_ast(v, names) for v in value.values)
    if isinstance(value, ast.Name):
        return value.id in names
    if isinstance(value, ast.Attribute):
        return value.attr in names
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in _BOOL_FUNCTIONS
        return isinstance(func, ast.Attribute) and func.attr in _BOOL_METHODS
    return False
