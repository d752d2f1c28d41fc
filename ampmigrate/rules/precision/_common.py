"""What the AMP4 rules share: is this file training code, and how to spell `torch.bfloat16` here."""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ampmigrate.analysis.scalers import find_scalers
from ampmigrate.engine.context import FileContext

BF16_TARGET = "bfloat16"
AMPERE = "Ampere and newer GPUs (A100, A10, L4, RTX 30/40, H100, B200)"


def targets_bf16(ctx) -> bool:
    return ctx.settings.target_dtype == BF16_TARGET


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
    found = False

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> Optional[bool]:
            nonlocal found
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
                found = True
            return not found

        def visit_FunctionDef(self, node: cst.FunctionDef) -> Optional[bool]:
            nonlocal found
            if node.name.value == "training_step":
                found = True
            return not found

    ctx.module.visit(_Visitor())
    return found


def line_of(ctx: FileContext, node: cst.CSTNode) -> int:
    return ctx.position(node).start.line
