"""AMP301's bug is real: the same training loop, run on CPU with float16 autocast and
`torch.amp.GradScaler("cpu")`, before and after `ampmigrate fix`.

Before the fix `clip_grad_norm_` sees gradients multiplied by the loss scale: the norm it measures
(and clips against) is the true norm times the scale, and after `scaler.step` unscales them the
update is `scale` times smaller than the clip threshold allows. After the fix the clip measures the
true gradients and the update has exactly the clipped size.
"""

from __future__ import annotations

import torch

from conftest import check, codes, fix

MAX_NORM = 0.5
LR = 0.1

TRAIN = '''import torch


def train(model, loader, optimizer, max_norm, log):
    scaler = torch.amp.GradScaler("cpu")
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        log.append((total_norm.item(), scaler.get_scale()))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
'''


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _data(steps: int):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)) for _ in range(steps)]


def _run(source: str, steps: int = 1):
    """Train `steps` iterations from seed 0; returns (log, how far the parameters moved)."""
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    torch.manual_seed(0)
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    log: list = []
    namespace["train"](model, _data(steps), optimizer, MAX_NORM, log)
    moved = torch.linalg.vector_norm(torch.cat([(p.detach() - s).flatten() for p, s in zip(model.parameters(), start)]))
    return log, moved.item()


def _true_grad_norm() -> float:
    """The gradient norm of the same first batch without any loss scaling."""
    torch.manual_seed(0)
    model = _model()
    x, y = _data(1)[0]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()


def test_the_fix_is_the_documented_recipe():
    assert codes(check(TRAIN)) == ["AMP301"]
    fixed = fix(TRAIN)
    assert fixed == TRAIN.replace(
        "        total_norm = torch.nn.utils.clip_grad_norm_",
        "        scaler.unscale_(optimizer)\n        total_norm = torch.nn.utils.clip_grad_norm_",
    )
    assert check(fixed) == []


def test_clip_sees_gradients_multiplied_by_the_loss_scale_before_the_fix():
    true_norm = _true_grad_norm()
    assert true_norm > MAX_NORM  # the clip is active in this setup

    (buggy_norm, buggy_scale), = _run(TRAIN)[0]
    (fixed_norm, fixed_scale), = _run(fix(TRAIN))[0]

    assert buggy_scale == fixed_scale == 2.0**16  # no overflow: the first step is taken in both runs
    # Before: the clip measured scale * true norm. After: the true norm.
    assert abs(buggy_norm / fixed_norm - buggy_scale) / buggy_scale < 1e-3
    assert abs(fixed_norm - true_norm) / true_norm < 1e-3


def test_after_the_fix_the_threshold_applies_to_the_true_gradients():
    _, buggy_moved = _run(TRAIN)
    _, fixed_moved = _run(fix(TRAIN))
    # SGD moves the parameters by lr * |clipped gradient|. Fixed: the gradient is clipped to
    # max_norm. Buggy: clipped to max_norm while scaled, then divided by the scale.
    assert abs(fixed_moved - LR * MAX_NORM) / (LR * MAX_NORM) < 1e-3
    assert abs(buggy_moved - LR * MAX_NORM / 2.0**16) / (LR * MAX_NORM / 2.0**16) < 1e-2
    assert abs(fixed_moved / buggy_moved - 2.0**16) / 2.0**16 < 1e-2


def test_training_keeps_its_scale_over_several_steps():
    """Several iterations: the fixed loop clips every step at the true norm, the buggy one at scale * norm."""
    buggy_log, _ = _run(TRAIN, steps=4)
    fixed_log, _ = _run(fix(TRAIN), steps=4)
    assert len(buggy_log) == len(fixed_log) == 4
    assert all(norm < 10 for norm, _ in fixed_log)
    assert all(norm > 1000 * MAX_NORM for norm, _ in buggy_log)
