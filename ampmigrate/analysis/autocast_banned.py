"""Calls that CUDA autocast refuses to run, found in the statements a migration would wrap.

torch registers `binary_cross_entropy` (`F.binary_cross_entropy`, `nn.BCELoss`) as banned under
CUDA autocast: it raises whatever the dtype of its inputs ("torch.nn.functional.binary_cross_entropy
and torch.nn.BCELoss are unsafe to autocast", `binary_cross_entropy_banned` in
aten/src/ATen/autocast_mode.cpp; https://pytorch.org/docs/stable/amp.html#ops-that-can-autocast-to-float32
lists its logits form as the safe one). apex refused it only for fp16 inputs, so apex code that
fed it fp32 (O2's fp32 model outputs, a `.float()`, a sigmoid registered as a float function)
trained; the same loss inside a new `torch.autocast` region fails at the first step. CPU autocast
does not ban it, so a CPU `verify` run cannot catch this: the planner must.

Followed, in the file: the call itself (`F.binary_cross_entropy(...)`), a callable bound to a
`BCELoss` (`criterion(...)`, `self.criterion(...)`), and the bodies of the functions, methods of
the class and `forward`s of the file's own modules the statements call, a few calls deep.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.engine.names import NameIndex

AUTOCAST_CUDA_BANNED = frozenset(
    {
        "torch.nn.functional.binary_cross_entropy",
        "torch.binary_cross_entropy",
        "torch._C._nn.binary_cross_entropy",
    }
)
AUTOCAST_CUDA_BANNED_MODULES = frozenset({"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})

_DEPTH = 3


def banned_call(names: NameIndex, statements: Iterable[cst.CSTNode]) -> Optional[cst.Call]:
    """The first call in `statements` that CUDA autocast refuses, or that leads to one through
    what it calls in this file; None when there is none."""
    found = banned_calls(names, statements)
    return found[0][0] if found else None


def banned_calls(names: NameIndex, statements: Iterable[cst.CSTNode]) -> List[Tuple[cst.Call, cst.Call]]:
    """(the call in `statements`, the banned call it is or leads to) for each banned call found,
    in order; a body reached twice is searched once."""
    seen: Set[int] = set()
    found: List[Tuple[cst.Call, cst.Call]] = []
    for statement in statements:
        _search(names, statement, seen, 0, None, found)
    return found


def _search(names: NameIndex, node: cst.CSTNode, seen: Set[int], depth: int, top: Optional[cst.Call], found) -> None:
    for call in walk(node):
        if not isinstance(call, cst.Call):
            continue
        here = top or call
        if names.qualified_names(call.func) & AUTOCAST_CUDA_BANNED or names.instance_classes(call.func) & AUTOCAST_CUDA_BANNED_MODULES:
            found.append((here, call))
            continue
        if depth >= _DEPTH:
            continue
        for body in _callee_bodies(names, call.func):
            if id(body) in seen:
                continue
            seen.add(id(body))
            _search(names, body, seen, depth + 1, here, found)


def _callee_bodies(names: NameIndex, func: cst.BaseExpression) -> List[cst.CSTNode]:
    """The bodies this file defines for `func`: a function, a method of the enclosing class, or
    the `forward` of a module class of this file that `func` holds an instance of."""
    bodies: List[cst.CSTNode] = []
    if isinstance(func, cst.Name):
        bindings = names.bindings_of(func)
    elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        cls = names.method_class_scope(func.value)
        if cls is None:
            return bodies
        bindings = cls.bindings.get(func.attr.value, []) + cls.self_attrs.get(func.attr.value, [])
    else:
        return bodies
    for binding in bindings:
        if binding.kind == "def" and isinstance(binding.node, cst.FunctionDef):
            bodies.append(binding.node.body)
        elif binding.kind == "assign" and isinstance(binding.value, cst.Call):
            bodies.extend(_forward_bodies(names, _constructor(binding.value)))
    return bodies


# nn.Module methods that return the module itself: `Net().cuda()`, `Net().to(device).train()`.
_RETURNS_SELF = frozenset({"cuda", "cpu", "to", "train", "eval", "float", "half", "double", "bfloat16", "requires_grad_"})


def _constructor(call: cst.Call) -> cst.BaseExpression:
    """The callee that built the object: `Net` for `Net(...).cuda()`."""
    while isinstance(call.func, cst.Attribute) and call.func.attr.value in _RETURNS_SELF and isinstance(call.func.value, cst.Call):
        call = call.func.value
    return call.func


def _forward_bodies(names: NameIndex, constructor: cst.BaseExpression) -> List[cst.CSTNode]:
    """`forward`/`__call__` of the class `constructor` names, when this file defines it."""
    if not isinstance(constructor, cst.Name):
        return []
    bodies = []
    for binding in names.bindings_of(constructor):
        if binding.kind != "class" or not isinstance(binding.node, cst.ClassDef):
            continue
        for statement in binding.node.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value in ("forward", "__call__"):
                bodies.append(statement.body)
    return bodies
