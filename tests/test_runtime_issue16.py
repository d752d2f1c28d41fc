"""Issue 16, run: the bf16 migration never breaks training (CPU-sized programs, real numerics).

1. FFT ops have no bfloat16 kernel: `fix --unsafe-fixes` casts the FFT inputs to float32, and the
   migrated vocoder trains in bfloat16; swapping the dtype alone raises in the FFT.
2. A step whose only inf/NaN guard was the GradScaler: the fix leaves the program as it is (fp16
   with its scaler), which trains finite through a corrupt batch; dropping the scaler protocol by
   hand (bfloat16, `loss.backward()`, `optimizer.step()`) applies the NaN update and never recovers.

Runs on the CPU (CPU autocast, `GradScaler("cpu")`); on a CUDA machine the fixtures pick "cuda".
"""

from __future__ import annotations

import math

import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, make_settings

torch = pytest.importorskip("torch")

VOCODER = FIXTURES / "AMP401" / "runtime_vocoder.py"
GUARD = FIXTURES / "AMP402" / "runtime_guard.py"


def _fixed(path) -> str:
    text = path.read_text(encoding="utf-8")
    result = Engine(make_settings({"unsafe-fixes": True})).fix_text(text, str(path))
    assert not result.errors
    return result.new_text if result.new_text is not None else text


def _load(text: str, name: str) -> dict:
    namespace = {"__name__": f"runtime_{name}"}
    exec(compile(text, f"runtime_{name}.py", "exec"), namespace)
    return namespace


def test_migrated_vocoder_trains_in_bfloat16_where_a_dtype_swap_breaks_the_fft():
    before = VOCODER.read_text(encoding="utf-8")
    after = _fixed(VOCODER)
    assert "torch.bfloat16" in after and ".float())" in after and "GradScaler(" not in after

    program = _load(after, "vocoder_after")
    torch.manual_seed(0)
    generator = program["make_generator"]()
    dtypes = set()
    generator[0].register_forward_hook(lambda module, inputs, output: dtypes.add(output.dtype))
    history = program["train"](generator, program["make_loader"]())
    assert all(math.isfinite(v) for v in history), history
    assert history[-1] < 0.8 * history[0], history
    if program["device"] == "cpu":
        assert dtypes == {torch.bfloat16}, "the generator does not run in bfloat16"

    naive = _load(before.replace("torch.float16", "torch.bfloat16"), "vocoder_naive")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        naive["train"](naive["make_generator"](), naive["make_loader"](), epochs=1)


def test_step_guarded_only_by_the_scaler_keeps_it_and_trains_finite():
    before = GUARD.read_text(encoding="utf-8")
    assert _fixed(GUARD) == before  # neither side moves: fp16 with its scaler (the step's only guard)

    program = _load(before, "guard_kept")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    history = program["train"](model, program["make_batches"]())
    bad = 5
    assert not math.isfinite(history[bad])  # the corrupt batch itself
    assert all(math.isfinite(v) for i, v in enumerate(history) if i != bad), history
    assert all(torch.isfinite(p).all() for p in model.parameters())

    # The scaler protocol dropped by hand (what removing it without a guard would do).
    naive_text = (
        before.replace("torch.float16", "torch.bfloat16")
        .replace("scaler.scale(loss).backward()", "loss.backward()")
        .replace("scaler.unscale_(optimizer)\n", "\n")
        .replace("scaler.step(optimizer)", "optimizer.step()")
        .replace("scaler.update()\n", "\n")
    )
    naive = _load(naive_text, "guard_dropped")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    history = naive["train"](model, naive["make_batches"]())
    assert all(not math.isfinite(v) for v in history[bad:]), history
