"""The class-spanning apex migrations run (issue 12): the fixtures' migrated code, with the
scaler and autocast moved to CPU, trains and takes the same steps as plain float32 training
with the same clipping (a GradScaler's scale cancels once `unscale_` runs before the clip).

`master_params_then_clip` guards a bug the migration had: `amp.master_params` collected in one
arm of an `if`, clipped after it, got an `unscale_` before each, and GradScaler raised at the
second ("unscale_() has already been called on this optimizer since the last update()").
"""

from __future__ import annotations

import pathlib
import types

import pytest
import torch
from conftest import fix

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "AMP101"


def _load(case: str, **options) -> types.ModuleType:
    text = fix((FIXTURES / f"{case}.py").read_text(encoding="utf-8"), select=["AMP1"], **options)
    assert "apex" not in text.split('"""', 2)[-1]
    text = text.replace('GradScaler("cuda"', 'GradScaler("cpu"').replace('autocast("cuda"', 'autocast("cpu"')
    module = types.ModuleType(case)
    exec(compile(text, case, "exec"), module.__dict__)
    return module


def _model(outputs: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, outputs))


def _batches(n: int, classes: int = 0):
    torch.manual_seed(1)
    if classes:
        return [(torch.randn(16, 4), torch.randint(0, classes, (16,))) for _ in range(n)]
    return [(torch.randn(16, 4), torch.randn(16, 1)) for _ in range(n)]


def _reference(batches, clip: float, autocast: bool = False, classes: int = 0):
    """Plain training with the same clip (and the same CPU float16 autocast where the migration
    put one): no scaler."""
    model = _model(classes or 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            outputs = model(x)
            if classes:
                loss = torch.nn.functional.cross_entropy(outputs, y)
            else:
                loss = torch.nn.functional.mse_loss(outputs, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_master_params_then_clip_unscales_once():
    module = _load("master_params_then_clip")
    batches = _batches(3)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    module.train(model, optimizer, batches, True, 0.05)  # raised before the fix
    _same(model, _reference(batches, 0.05, autocast=True))


@pytest.mark.parametrize("fp16", [True, False])
def test_optimizer_wrapper_backward_then_step(fp16):
    module = _load("class_optimizer_wrapper", unsafe_fixes=True)
    batches = _batches(3)
    model = _model()
    wrapper = module.Optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), fp16=fp16, max_grad_norm=0.05)
    for x, y in batches:
        wrapper.zero_grad()
        wrapper.backward(torch.nn.functional.mse_loss(wrapper.model(x), y))
        wrapper.step()
    _same(wrapper.model, _reference(batches, 0.05))
    assert wrapper.scaler.is_enabled() is fp16


def test_wrapper_builder_scaler_on_the_wrapper():
    module = _load("class_wrapper_builder", unsafe_fixes=True)
    batches = _batches(3)
    model = _model()
    config = types.SimpleNamespace(lr=0.1, precision="amp", clip=0.05)
    wrapper = module.make(model, config)
    wrapper.inner.param_groups[0]["momentum"] = 0.0  # compare with plain SGD
    for x, y in batches:
        wrapper.backward(torch.nn.functional.mse_loss(model(x), y))
        wrapper.step()
    _same(model, _reference(batches, 0.05))
    assert wrapper.scaler.get_scale() == 65536.0  # scaled (and no overflow skipped a step)


def test_rescale_helper_unscales_before_the_helper():
    module = _load("class_rescale_helper")
    batches = _batches(4, classes=3)
    model = _model(3)
    trainer = module.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_norm=0.05, fp16=True)
    trainer.train_epoch([[batch] for batch in batches])
    _same(model, _reference(batches, 0.05, autocast=True, classes=3))


@pytest.mark.parametrize("fp16", [True, False])
def test_setup_method_fp32_path_untouched(fp16):
    """`__init__`'s disabled scaler: without `enable_amp()` the step is plain float32 training
    (no autocast), with it the forward runs under autocast and the loss is scaled."""
    module = _load("class_setup_method")
    batches = _batches(3)
    model = _model()
    trainer = module.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), fp16=fp16)
    assert trainer.scaler.is_enabled() is fp16
    if fp16:  # a smaller initial scale, so that no float16 overflow skips a step of the comparison
        trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    for x, y in batches:
        trainer.train_step(x, y)
    _same(model, _reference(batches, float("inf"), autocast=fp16))
