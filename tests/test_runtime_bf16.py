"""The AMP401 + AMP402 unsafe fix, run: a fixture training loop trains before and after the fix,
and after it the autocast region really computes in bfloat16 and no GradScaler is made.

Runs on the CPU (torch >= 2.3: CPU float16 autocast and GradScaler("cpu")); on a CUDA machine the
fixture picks "cuda" and the same assertions hold there.
"""

from __future__ import annotations

import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, make_settings

torch = pytest.importorskip("torch")

FIXTURE = FIXTURES / "AMP401" / "runtime_train.py"


def _run(text: str, name: str, tmp_path, monkeypatch):
    """Execute one version of the fixture; return its loss history, the dtypes of the first
    layer's outputs, and how many GradScalers it made."""
    scalers = []
    original_init = torch.amp.GradScaler.__init__

    def counting_init(self, *args, **kwargs):
        scalers.append(self)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "__init__", counting_init)
    namespace = {"__name__": f"runtime_{name}"}
    exec(compile(text, f"runtime_{name}.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    dtypes = set()
    model[0].register_forward_hook(lambda module, inputs, output: dtypes.add(output.dtype))
    history = namespace["train"](model, namespace["make_loader"](), tmp_path / f"{name}.pt")
    assert namespace["resume"](model, tmp_path / f"{name}.pt") == len(history) - 1
    return history, dtypes, len(scalers)


def test_bf16_fix_trains_in_bfloat16_without_a_scaler(tmp_path, monkeypatch):
    before = FIXTURE.read_text(encoding="utf-8")
    result = Engine(make_settings({"unsafe-fixes": True})).fix_text(before, str(FIXTURE))
    assert not result.errors
    after = result.new_text
    assert after is not None and "torch.bfloat16" in after and "GradScaler(" not in after

    history, dtypes, scalers = _run(before, "before", tmp_path, monkeypatch)
    assert history[-1] < 0.6 * history[0], history
    assert dtypes == {torch.float16} and scalers == 1

    history, dtypes, scalers = _run(after, "after", tmp_path, monkeypatch)
    assert history[-1] < 0.6 * history[0], history
    assert dtypes == {torch.bfloat16}, "the autocast region does not run in bfloat16"
    assert scalers == 0, "the fixed loop still creates a GradScaler"
