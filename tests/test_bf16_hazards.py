"""FFT ops have no bfloat16 kernel (issue 16): the AMP401 fix casts a real-input op's input to float32,
and is withheld for complex-input ops and for FFTs in helpers of other files."""

from __future__ import annotations

import pytest

from conftest import check, codes, fix

TRAIN = """
import torch
{imports}
def train(model, loader, optimizer):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
        loss = ({loss} - y).abs().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""


@pytest.mark.parametrize(
    "imports, loss, op, cast",
    [
        ("", "torch.stft(out, 256, return_complex=True).abs()", "torch.stft", "torch.stft(out.float(), 256"),
        ("from torch.fft import rfft as spectrum", "spectrum(out).abs()", "torch.fft.rfft", "spectrum(out.float())"),
        ("", "torch.fft.rfft(input=out + 1).abs()", "torch.fft.rfft", "torch.fft.rfft(input=(out + 1).float())"),
    ],
)
def test_real_input_fft_gets_its_input_cast_to_float32(imports, loss, op, cast):
    text = TRAIN.format(imports=imports, loss=loss)
    findings = check(text, **{"unsafe-fixes": True})
    assert codes(findings) == ["AMP401"] and findings[0].fix is not None
    assert f"`{op}`" in findings[0].fix.message and "float32" in findings[0].fix.message
    fixed = fix(text, **{"unsafe-fixes": True})
    assert cast in fixed and "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed


@pytest.mark.parametrize(
    "imports, loss, op",
    [
        ("from torch import fft", "fft.irfft(out)", "torch.fft.irfft"),
        ("", "torch.istft(out, 256)", "torch.istft"),
        ("", "torch.fft.fft(out).abs()", "torch.fft.fft"),
    ],
)
def test_complex_input_fft_keeps_fp16_and_its_scaler(imports, loss, op):
    text = TRAIN.format(imports=imports, loss=loss)
    findings = check(text, **{"unsafe-fixes": True})
    assert codes(findings) == ["AMP401"] and findings[0].fix is None
    assert f"`{op}`" in findings[0].no_fix_reason and "bfloat16" in findings[0].no_fix_reason
    assert fix(text, **{"unsafe-fixes": True}) == text  # neither side moves: fp16 with its scaler


@pytest.mark.parametrize(
    "imports, loss",
    [
        ("", "torch.stft(out.float(), 256, return_complex=True).abs()"),
        ("", "torch.fft.rfft(out.to(torch.float32)).abs()"),
        ("def stft(t):\n    return t", "stft(out)"),  # a function of the project's own, not torch's
    ],
)
def test_float32_input_or_lookalike_is_no_hazard(imports, loss):
    text = TRAIN.format(imports=imports, loss=loss)
    fixed = fix(text, **{"unsafe-fixes": True})
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed


@pytest.mark.parametrize("op", ["stft", "rfft"])
def test_the_table_holds_for_installed_torch_on_cpu(op):
    """The premise: these ops reject bfloat16 (float32 works). If torch gains the kernels, revisit the table."""
    torch = pytest.importorskip("torch")
    x = torch.randn(1024)
    run = {
        "stft": lambda t: torch.stft(t, 256, window=torch.hann_window(256, dtype=t.dtype), return_complex=True),
        "rfft": lambda t: torch.fft.rfft(t),
    }[op]
    run(x)
    with pytest.raises(RuntimeError, match="BFloat16"):
        run(x.bfloat16())
