"""What the AMP4 rules share: is this file training code, and how to spell `torch.bfloat16` here."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from ampmigrate.analysis.scalers import find_scalers
from ampmigrate.engine.project_index import is_test_file  # noqa: F401  (one definition, shared)
from ampmigrate.engine.context import FileContext

BF16_TARGET = "bfloat16"
AMPERE = "Ampere and newer GPUs (A100, A10, L4, RTX 30/40, H100, B200)"


def targets_bf16(ctx) -> bool:
    return ctx.settings.target_dtype == BF16_TARGET


def recommends_bf16(ctx) -> bool:
    """Whether the rules that recommend a precision apply here: the bf16 target, and not a test
    file (`test_*.py`, `*_test.py`, `conftest.py`), where float16 is exercised on purpose."""
    return recommends_bf16_at(ctx.path, ctx.settings)


def recommends_bf16_at(path: str, settings) -> bool:
    """`recommends_bf16` before the file is read: what a rule's `applies_to` answers."""
    return settings.target_dtype == BF16_TARGET and not is_test_file(path)




def is_training_file(ctx: FileContext) -> bool:
    """Does the file train a model: call `.backward()`, hold a GradScaler, use a `torch.optim`
    optimizer, or define a Lightning `training_step`? Autocast in inference-only code is left
    alone: fp16's extra mantissa bits are no loss there, and there are no gradients to underflow."""
    return ctx.shared("precision.training", lambda: _trains(ctx))


def _trains(ctx: FileContext) -> bool:
    if find_scalers(ctx):
        return True
    for _, qnames in ctx.names.qualified_expressions():
        if any(q.startswith("torch.optim.") for q in qnames):
            return True
    if any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
        for call in ctx.names.nodes_of_type(cst.Call)
    ):
        return True
    if any(node.name.value == "training_step" for node in ctx.names.nodes_of_type(cst.FunctionDef)):
        return True
    # Issue 11: the backward runs in a loss-scaler class of another file that this one imports
    # (`loss_scaler(loss, optimizer, clip_grad=...)`, timm's NativeScaler shape).
    index = ctx.project_index
    return index is not None and index.backward_runner_imported(ctx.path) is not None


def trained_elsewhere(ctx: FileContext, node: cst.CSTNode) -> Optional[str]:
    """For code of a file that trains nothing itself: another file of the run that trains and
    imports, by name, the top-level function or class holding `node` (a model whose forward
    autocasts, trained in train.py): that file, relative to the project root."""
    trainer = _trainer(ctx, node)
    return ctx.project_index.relative(trainer) if trainer else None


def trainer_scales_loss(ctx: FileContext, node: cst.CSTNode) -> bool:
    """The file `trained_elsewhere` names scales its loss with a GradScaler."""
    trainer = _trainer(ctx, node)
    return trainer is not None and ctx.project_index.scales_loss(trainer)


def _trainer(ctx: FileContext, node: cst.CSTNode) -> Optional[str]:
    index = ctx.project_index
    if index is None:
        return None
    top = None
    for ancestor in ctx.names.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            top = ancestor
    if top is None or _wraps_for_caller(ctx, node):
        return None
    return index.trained_with(ctx.path, top.name.value)


def _wraps_for_caller(ctx: FileContext, node: cst.CSTNode) -> bool:
    """`node` is in a context-manager wrapper (`with autocast(...): yield`, `@contextmanager`):
    the precision is its caller's choice, not this module's."""
    for ancestor in ctx.names.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            if any(_decorator_name(d.decorator) in ("contextmanager", "asynccontextmanager") for d in ancestor.decorators):
                return True
            return any(isinstance(n, (cst.Yield)) and ctx.names.enclosing(n, cst.FunctionDef) is ancestor for n in ctx.names.nodes_of_type(cst.Yield))
    return False


def _decorator_name(decorator: cst.BaseExpression) -> str:
    if isinstance(decorator, cst.Call):
        decorator = decorator.func
    if isinstance(decorator, cst.Attribute):
        return decorator.attr.value
    return decorator.value if isinstance(decorator, cst.Name) else ""


_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})
_INFERENCE_WORDS = frozenset(
    {"eval", "evaluate", "evaluation", "val", "valid", "validate", "validation", "test", "infer", "inference",
     "predict", "prediction", "generate", "generation", "sample", "sampling"}
)
_TRAINING_WORDS = frozenset({"train", "training", "fit"})


def in_inference_code(ctx: FileContext, node: cst.CSTNode) -> bool:
    """`node` runs without gradients (inside `with torch.no_grad()` / `inference_mode()`, or a
    function decorated with them) or in a function named for evaluation (`validate`,
    `validation_step`, `generate`, ...): float16 there trains nothing."""
    for ancestor in ctx.names.ancestors(node):
        if isinstance(ancestor, cst.With) and any(_no_grad(ctx, item.item) for item in ancestor.items):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            if any(_no_grad(ctx, d.decorator) for d in ancestor.decorators):
                return True
            words = set(ancestor.name.value.lower().strip("_").split("_"))
            if words & _INFERENCE_WORDS and not words & _TRAINING_WORDS:
                return True
    return False


def _no_grad(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Call):
        expr = expr.func
    return bool(ctx.names.qualified_names(expr) & _NO_GRAD)


# Identifiers in a condition that pick the precision by hardware: `torch.cuda.is_bf16_supported()`,
# `get_device_capability()[0] >= 8`, `use_bf16`, `AMPERE_OR_NEWER`, ...
_BF16_CHOICE = re.compile(r"bf16|bfloat16|capabilit|ampere", re.IGNORECASE)


def in_bf16_choice(ctx: FileContext, node: cst.CSTNode) -> bool:
    """True when `node` sits in a branch of an `if` (or ternary) that tests for bf16 support:
    the code already chooses fp16 only where bf16 is missing, so it is right as it is."""
    child: cst.CSTNode = node
    for ancestor in ctx.names.ancestors(node):
        if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test and _mentions_bf16(ancestor.test):
            return True
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        child = ancestor
    return False


def _mentions_bf16(expression: cst.CSTNode) -> bool:
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            nonlocal found
            found = found or bool(_BF16_CHOICE.search(node.value))

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            nonlocal found
            found = found or bool(_BF16_CHOICE.search(node.value))

    expression.visit(_Finder())
    return found


def line_of(ctx: FileContext, node: cst.CSTNode) -> int:
    return ctx.position(node).start.line
