"""Ops with no bfloat16 kernel: where a file calls one, a float16 -> bfloat16 autocast fix is withheld.

Under float16 autocast these ops run (cuFFT has half-precision transforms for power-of-two sizes), but
bfloat16 inputs fail: cuFFT has no bfloat16 transform and MKL's FFT rejects both half types
(torch 2.13 on CPU: `torch.stft(x.bfloat16(), 256, ...)` raises
"MKL FFT doesn't support tensors of type: BFloat16"; `torch.fft.rfft(x.bfloat16())` raises
"Unsupported dtype BFloat16").
Sources: https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/SpectralOps.cpp
(promote_tensor_fft: Half only, on CUDA), https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/mkl/SpectralOps.cpp
and https://docs.nvidia.com/cuda/cufft/ (half precision: power-of-two sizes; no bfloat16).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ampmigrate.rules.precision._common import line_of

# Qualified names (exact) and prefixes of ops without bfloat16 kernels.
HAZARD_OPS = frozenset({"torch.stft", "torch.istft", "torch.functional.stft", "torch.functional.istft"})
HAZARD_PREFIXES = ("torch.fft.",)


def _is_hazard(qname: str) -> bool:
    return qname in HAZARD_OPS or qname.startswith(HAZARD_PREFIXES)


def _casts_to_float32(expr: cst.BaseExpression) -> bool:
    """`x.float()` / `x.to(torch.float32)`: the op already gets float32."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    method = expr.func.attr.value
    if method == "float":
        return True
    return method in ("to", "type") and any(
        isinstance(a.value, cst.Attribute) and a.value.attr.value in ("float32", "float") for a in expr.args
    )


def bf16_hazard(ctx) -> Optional[str]:
    """The first call in this file of an op bfloat16 breaks, whose input is not already float32, as a reason."""
    for node, qnames in ctx.names.qualified_expressions():
        hazard = next((q for q in sorted(qnames) if _is_hazard(q)), None)
        if hazard is None:
            continue
        call = ctx.names.parent(node)
        if isinstance(call, cst.Call) and call.func is node and call.args and _casts_to_float32(call.args[0].value):
            continue
        return (
            f"this file calls `{hazard}` (line {line_of(ctx, node)}), which has no bfloat16 kernel (cuFFT and "
            f"MKL FFT): cast its input to float32 (`.float()`) before moving autocast to bfloat16"
        )
    return None
