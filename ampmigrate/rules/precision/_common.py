"""What the AMP4 rules share: is this file training code, and how to spell `torch.bfloat16` here."""

from __future__ import annotations

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


def line_of(ctx: FileContext, node: cst.CSTNode) -> int:
    return ctx.position(node).start.line
