"""Ops with no bfloat16 kernel: a float16 -> bfloat16 autocast fix casts their input to float32, or
is withheld where it cannot (a complex input, an FFT in a helper of another file).

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

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

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


# Transforms of a real input: the fix casts their input to float32 (`.float()` cannot lose anything a
# real tensor holds). The others (istft, the complex and inverse transforms) take complex input, which
# `.float()` would truncate: they block the fix instead.
REAL_INPUT_OPS = frozenset(
    {"torch.stft", "torch.functional.stft", "torch.fft.rfft", "torch.fft.rfft2", "torch.fft.rfftn"}
)
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


@dataclass
class Hazards:
    """What moving this file's autocast to bfloat16 must do about FFT ops: `reason` blocks the
    fix; `casts` are (input expression, `input.float()`) edits the fix makes."""

    reason: Optional[str] = None
    casts: List[Tuple[cst.BaseExpression, cst.BaseExpression]] = field(default_factory=list)
    ops: List[Tuple[str, int]] = field(default_factory=list)  # (op, line) of each cast

    def note(self) -> str:
        where = ", ".join(f"`{op}` (line {line})" for op, line in self.ops)
        return f"; the input of {where} is cast to float32 (`.float()`): FFTs have no bfloat16 kernel"


def bf16_hazards(ctx) -> Hazards:
    """The FFT ops of this file (and of helpers this file calls in other files of the run, from
    the project index) that bfloat16 values would break, and what the fix does about them."""
    return ctx.file.shared("bf16_hazards", lambda: _hazards(ctx))


def _hazards(ctx) -> Hazards:
    found = Hazards()
    for node, qnames in ctx.names.qualified_expressions():
        hazard = next((q for q in sorted(qnames) if _is_hazard(q)), None)
        if hazard is None:
            continue
        call = ctx.names.parent(node)
        called = isinstance(call, cst.Call) and call.func is node
        first = _input_arg(call) if called else None
        if first is not None and _casts_to_float32(first.value):
            continue
        if first is None or hazard not in REAL_INPUT_OPS:
            return Hazards(
                reason=f"this file calls `{hazard}` (line {line_of(ctx, node)}), which has no bfloat16 kernel (cuFFT "
                "and MKL FFT) and takes complex input here or cannot be followed: cast its input to float32 before "
                "moving autocast to bfloat16"
            )
        value = first.value
        operand = value if isinstance(value, _ATOMS) and not value.lpar else value.with_changes(
            lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
        )
        found.casts.append((value, cst.Call(cst.Attribute(operand, cst.Name("float")))))
        found.ops.append((hazard, line_of(ctx, node)))
    helper = _fft_helper_called(ctx)
    if helper is not None:
        return Hazards(reason=helper)
    return found


def _input_arg(call: cst.Call) -> Optional[cst.Arg]:
    """The tensor argument of an FFT op: the first positional one, or `input=`."""
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == "input":
            return arg
    return None


def _fft_helper_called(ctx) -> Optional[str]:
    """A call of a function of another file of the run that runs an FFT op on what it is given
    (`mel_spectrogram(y_hat)`, a spectral loss): the fix cannot cast there from here."""
    index = ctx.file.project_index
    if index is None:
        return None
    for call in ctx.names.nodes_of_type(cst.Call):
        if not isinstance(call.func, (cst.Name, cst.Attribute)):
            continue
        for qname in sorted(ctx.names.qualified_names(call.func)):
            found = index.fft_helper(qname, ctx.file.path)
            if found is not None:
                path, op = found
                return (
                    f"`{ctx.code(call.func).strip()}` ({index.relative(path)}, called at line {line_of(ctx, call)}) "
                    f"runs `{op}`, which has no bfloat16 kernel: cast its input to float32 there before moving "
                    "autocast to bfloat16"
                )
    return None
