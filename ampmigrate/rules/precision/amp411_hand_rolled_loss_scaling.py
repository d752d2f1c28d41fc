"""AMP411: loss scaling written by hand (the loss multiplied by a scale, the gradients divided by it).

Pre-`torch.amp` float16 training scaled the loss itself: `(loss * loss_scale).backward()` (or
`loss = loss * self.loss_scale`), then `p.grad.div_(loss_scale)` / `p.grad.mul_(1.0 / scale)` /
`p.grad /= scale` before the step, often with a hand-made dynamic schedule. Both halves must use
the same scale (after following a local `loss_scale = 2 ** self.lg_loss_scale`), in one function,
or in methods of one class when the scale is an attribute of `self`. Multiplying the loss alone
(`loss * (1 / accumulation_steps)`, a loss weight) is never reported: without the division of the
gradients it is not loss scaling. Nor is the fallback a torch version check keeps for torch without
`torch.amp` beside a branch that uses it (mmcv's `Fp16OptimizerHook` before torch 1.6).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.version_gates import chooses_modern, version_gate
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import is_test_file

_GRAD = "grad"


class HandRolledLossScaling(Rule):
    code = "AMP411"
    triggers = (r"\.grad\b",)
    requires = (
        r"\*",  # the loss is multiplied by the scale
        r"\.\s*(?:div_|mul_)\s*\(|/=|\*=",  # and the gradients divided (in place) by it
    )

    def applies_to(self, path, settings) -> bool:
        return not is_test_file(path)

    def screen(self, tree: ast.Module) -> bool:
        # The pre-filter's one index of the tree's nodes by type (engine/ast_nodes.py), not two
        # walks of the whole tree.
        return any(node.attr == _GRAD for node in nodes_of(tree, ast.Attribute)) and any(
            isinstance(node.op, ast.Mult) for kind in (ast.BinOp, ast.AugAssign) for node in nodes_of(tree, kind)
        )

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        names = ctx.names
        unscales: Dict[Tuple[object, str], cst.CSTNode] = {}
        for node, divisor in _gradient_divisions(names):
            for owner in _owners(names, node, divisor):
                unscales.setdefault((owner, _key(names, divisor)), node)
        if not unscales:
            return
        reported: Set[int] = set()
        loss_names = _loss_names(names)
        for product, scale in _loss_products(names):
            if not _becomes_backward(names, product, loss_names) or _fallback_for_old_torch(names, product):
                continue
            for owner in _owners(names, product, scale):
                unscale = unscales.get((owner, _key(names, scale)))
                if unscale is None or id(product) in reported:
                    continue
                reported.add(id(product))
                scale_text = ctx.code(scale).strip()
                line = ctx.position(unscale).start.line
                ctx.report(
                    product,
                    f"loss scaling written by hand: the loss is multiplied by `{scale_text}` and the gradients "
                    f"divided by it (line {line}); `torch.amp.GradScaler(\"cuda\")` does this with a dynamic "
                    "scale and skips steps whose gradients overflow, and bfloat16 autocast (Ampere and newer) "
                    "needs no loss scaling at all",
                    no_fix_reason="the model, its float32 master copy and the scaling code must move to "
                    "autocast and a GradScaler together, which needs a hand",
                )


def _is_torch_amp(qname: str) -> bool:
    return qname.startswith(("torch.cuda.amp.", "torch.amp.", "torch.cpu.amp.")) or qname == "torch.autocast"


def _fallback_for_old_torch(names, node: cst.CSTNode) -> bool:
    """The scaling sits in the branch a torch version check (or a try-import) keeps for torch
    without `torch.amp` (mmcv's `Fp16OptimizerHook` before torch 1.6), beside a branch that uses it."""
    gate = version_gate(names, node)
    return gate is not None and chooses_modern(names, gate, node, _is_torch_amp)


def _gradient_divisions(names) -> List[Tuple[cst.CSTNode, cst.BaseExpression]]:
    """(node, divisor) for `g.div_(s)`, `g.mul_(1 / s)`, `g /= s`, `g *= 1 / s`, `g.data = g.data / s`
    where `g` is a `.grad` (or `.grad.data`) attribute."""
    found = []
    for call in names.nodes_of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in ("div_", "mul_") and len(call.args) == 1):
            continue
        if not _is_gradient(func.value) or call.args[0].keyword is not None or call.args[0].star:
            continue
        divisor = call.args[0].value if func.attr.value == "div_" else _reciprocal(call.args[0].value)
        if divisor is not None:
            found.append((call, divisor))
    for node in names.nodes_of_type(cst.AugAssign):
        if not _is_gradient(node.target):
            continue
        if isinstance(node.operator, cst.DivideAssign):
            found.append((node, node.value))
        elif isinstance(node.operator, cst.MultiplyAssign):
            divisor = _reciprocal(node.value)
            if divisor is not None:
                found.append((node, divisor))
    for node in names.nodes_of_type(cst.Assign):
        value = node.value
        if (
            len(node.targets) == 1
            and _is_gradient(node.targets[0].target)
            and isinstance(value, cst.BinaryOperation)
            and isinstance(value.operator, cst.Divide)
            and _is_gradient(value.left)
        ):
            found.append((node, value.right))
    return found


def _loss_products(names) -> List[Tuple[cst.CSTNode, cst.BaseExpression]]:
    """(node, scale) for each multiplication that may scale a loss: `a * s` (either side) and `a *= s`.
    The node reported is the product (or the augmented assignment)."""
    found = []
    for node in names.nodes_of_type(cst.BinaryOperation):
        if isinstance(node.operator, cst.Multiply) and not _is_gradient(node.left) and not _is_gradient(node.right):
            found.append((node, node.right))
            found.append((node, node.left))
    for node in names.nodes_of_type(cst.AugAssign):
        if isinstance(node.operator, cst.MultiplyAssign) and not _is_gradient(node.target):
            found.append((node, node.value))
    return found


def _loss_names(names) -> Set[Tuple[object, str]]:
    """(function, name) for each name a function calls `.backward()` on or returns."""
    found: Set[Tuple[object, str]] = set()
    for node in names.nodes_of_type((cst.Attribute, cst.Return)):
        if isinstance(node, cst.Return):
            # `return ret_loss` or `return {"last_loss": ret_loss}`
            returned = _names_in(node.value) if node.value is not None else []
        elif node.attr.value == "backward" and isinstance(node.value, cst.Name):
            returned = [node.value.value]
        else:
            continue
        function = names.enclosing(node, cst.FunctionDef)
        found.update((function, name) for name in returned)
    return found


def _names_in(node: cst.CSTNode) -> List[str]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            found.append(current.value)
        elif not isinstance(current, (cst.Lambda, cst.Call)):
            stack.extend(current.children)
    return found


def _becomes_backward(names, product: cst.CSTNode, loss_names: Set[Tuple[object, str]]) -> bool:
    """The product is a loss: `.backward()` is called on it, or on the name it is assigned to (in
    the same function), or it is returned (a callback that hands the scaled loss to the trainer)."""
    parent = names.parent(product)
    if isinstance(product, cst.AugAssign):
        target = product.target
    elif isinstance(parent, cst.Attribute) and parent.value is product:
        return parent.attr.value == "backward"
    elif isinstance(parent, cst.Return):
        return True
    elif isinstance(parent, cst.Assign) and parent.value is product and len(parent.targets) == 1:
        target = parent.targets[0].target
    else:
        return False
    if not isinstance(target, cst.Name):
        return False
    return (names.enclosing(product, cst.FunctionDef), target.value) in loss_names


def _is_gradient(node: cst.BaseExpression) -> bool:
    """`p.grad`, `p.grad.data`, `params[0].grad`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return isinstance(node, cst.Attribute) and node.attr.value == _GRAD


def _reciprocal(node: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """`s` for `1 / s` or `1.0 / s`."""
    node = _unparenthesized(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        left = node.left
        if isinstance(left, (cst.Integer, cst.Float)) and float(left.evaluated_value) == 1.0:
            return node.right
    return None


def _unparenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=(), rpar=()) if getattr(node, "lpar", None) else node


def _owners(names, node: cst.CSTNode, scale: cst.BaseExpression) -> List[object]:
    """Where both halves must meet: the enclosing function, and also its class when the scale is
    read from `self` (one method scales the loss, another unscales the gradients)."""
    function = names.enclosing(node, cst.FunctionDef)
    owners: List[object] = [function if function is not None else names.module]
    value = _value(names, scale)
    if function is not None and _reads_self(value):
        cls = names.enclosing(function, cst.ClassDef)
        if cls is not None:
            owners.append(cls)
    return owners


def _reads_self(node: cst.BaseExpression) -> bool:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Attribute):
            root = current.value
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name) and root.value == "self":
                return True
        stack.extend(current.children)
    return False


def _value(names, node: cst.BaseExpression) -> cst.BaseExpression:
    """A local name bound once in its function (`loss_scale = 2 ** self.lg_loss_scale`): its value."""
    node = _unparenthesized(node)
    if isinstance(node, cst.Name):
        bindings = names.bindings_of(node)
        if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
            if bindings[0].scope.kind == "function":
                return _unparenthesized(bindings[0].value)
    return node


def _key(names, node: cst.BaseExpression) -> str:
    value = _value(names, node)
    code = cst.Module([]).code_for_node(value)
    try:
        return ast.dump(ast.parse(code.strip(), mode="eval"))
    except SyntaxError:  # pragma: no cover - it came from a parsed module
        return code
