"""The value a torch version check has on every torch that min-torch allows, where it is fixed.

AMP206's fix deletes the legacy branch of a compatibility gate only when the gate's condition is
known on every supported torch: a comparison of the torch version with a literal release
(`Version(torch.__version__) >= Version("2.3")`, `torch.__version__ >= "2.4"`: torch's
`TorchVersion` compares as a version), a feature probe of a modern name (`hasattr(torch.amp,
"custom_fwd")`), a module-level name bound once to one of those (`_TORCH_GE_2_4 = ...`), and
`not`/`and`/`or` of them. Anything else (an imported flag, a device check) is unknown: no fix.
Release semantics: torch 2.4's pre-releases count as 2.4, where the modern branch exists too.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import libcst as cst

from ampmigrate.api import MODERN_SINCE, VERSION_PARSERS
from ampmigrate.engine.names import NameIndex

Version = Tuple[int, int]
_RELEASE = re.compile(r"\s*(\d+)\.(\d+)(?:\.(\d+))?")
_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}
_MAX_DEPTH = 8


def outcome(names: NameIndex, test: cst.BaseExpression, min_torch: Version, depth: int = 0) -> Optional[bool]:
    """True or False when `test` has that value on every torch >= `min_torch`; else None."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = outcome(names, test.expression, min_torch, depth + 1)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left = outcome(names, test.left, min_torch, depth + 1)
        right = outcome(names, test.right, min_torch, depth + 1)
        decisive = isinstance(test.operator, cst.Or)  # True decides an `or`, False an `and`
        if decisive in (left, right):
            return decisive
        return None if left is None or right is None else not decisive
    if isinstance(test, cst.Call):
        return _probe(names, test, min_torch)
    if isinstance(test, cst.Comparison):
        return _comparison(names, test, min_torch)
    if isinstance(test, cst.Name):
        bindings = names.bindings_of(test)
        if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].scope.kind == "module":
            value = bindings[0].value
            if value is not None:
                return outcome(names, value, min_torch, depth + 1)
    return None


def _probe(names: NameIndex, call: cst.Call, min_torch: Version) -> Optional[bool]:
    """`hasattr(torch.amp, "custom_fwd")`: True where the name exists on every allowed torch."""
    if not (isinstance(call.func, cst.Name) and call.func.value == "hasattr" and len(call.args) == 2):
        return None
    if "builtins.hasattr" not in names.qualified_names(call.func) and names.bindings_of(call.func):
        return None  # a `hasattr` of the file's own
    attribute = call.args[1].value
    if not isinstance(attribute, cst.SimpleString):
        return None
    for owner in names.qualified_names(call.args[0].value):
        since = MODERN_SINCE.get(f"{owner}.{attribute.evaluated_value}")
        if since is not None and since <= min_torch:
            return True
    return None


def _comparison(names: NameIndex, test: cst.Comparison, min_torch: Version) -> Optional[bool]:
    if len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    operator = target.operator.__class__.__name__
    op = {"GreaterThanEqual": ">=", "GreaterThan": ">", "LessThanEqual": "<=", "LessThan": "<"}.get(operator)
    if op is None:
        return None
    left, right = test.left, target.comparator
    literal = _release(names, left, right)
    if literal is None:
        literal = _release(names, right, left)
        op = _FLIPPED[op]
    if literal is None:
        return None
    major_minor, patch = literal
    # Every release >= min_torch is >= X.Y.Z when min_torch >= X.Y and Z is 0, or min_torch > X.Y.
    at_least = min_torch >= major_minor if patch == 0 else min_torch > major_minor
    above = min_torch > major_minor
    if op == ">=":
        return True if at_least else None
    if op == ">":
        return True if above else None
    if op == "<":
        return False if at_least else None
    return False if above else None  # "<="


def _release(names: NameIndex, torch_side: cst.BaseExpression, literal_side: cst.BaseExpression):
    """((major, minor), patch) when `torch_side` is torch's version and `literal_side` a release."""
    parser = _parsed_torch_version(names, torch_side)
    if parser is None:
        return None
    if parser == "torch":  # TorchVersion compares with a string (or a tuple) as a version
        text = _string(literal_side)
    else:
        if not isinstance(literal_side, cst.Call) or len(literal_side.args) != 1:
            return None
        if parser not in names.qualified_names(literal_side.func):
            return None
        text = _string(literal_side.args[0].value)
    match = _RELEASE.match(text or "")
    if match is None:
        return None
    return (int(match.group(1)), int(match.group(2))), int(match.group(3) or 0)


def _parsed_torch_version(names: NameIndex, node: cst.BaseExpression) -> Optional[str]:
    """"torch" for `torch.__version__`; the parser's name for `parse(torch.__version__)`."""
    if "torch.__version__" in names.qualified_names(node):
        return "torch"
    if isinstance(node, cst.Call) and len(node.args) == 1:
        if "torch.__version__" in names.qualified_names(node.args[0].value):
            parsers = names.qualified_names(node.func) & VERSION_PARSERS
            if parsers:
                return next(iter(parsers))
    return None


def _string(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None
