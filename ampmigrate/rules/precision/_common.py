"""What the AMP4 rules share: is this file training code, and how to spell `torch.bfloat16` here."""

from __future__ import annotations

import re
from pathlib import PurePath

import libcst as cst

from ampmigrate.analysis.scalers import find_scalers
from ampmigrate.engine.context import FileContext

BF16_TARGET = "bfloat16"
AMPERE = "Ampere and newer GPUs (A100, A10, L4, RTX 30/40, H100, B200)"


def targets_bf16(ctx) -> bool:
    return ctx.settings.target_dtype == BF16_TARGET


def recommends_bf16(ctx) -> bool:
    """Whether the rules that recommend a precision apply here: the bf16 target, and not a test
    file (`test_*.py`, `*_test.py`, `conftest.py`), where float16 is exercised on purpose."""
    return targets_bf16(ctx) and not is_test_file(ctx.path)


def is_test_file(path: str) -> bool:
    name = PurePath(path).name
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


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
    return any(node.name.value == "training_step" for node in ctx.names.nodes_of_type(cst.FunctionDef))


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
