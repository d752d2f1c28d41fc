"""The apex migration of a clip on every micro-step of gradient accumulation keeps apex's numerics.

apex (O1, no `delay_unscale`) unscales the gradients at the exit of every `amp.scale_loss`, so
a clip after each backward clips the unscaled partial sums, while the optimizer steps every N
micro-steps. The safe fix keeps the clip there with its threshold multiplied by
`scaler.get_scale()` (GradScaler keeps the gradients scaled until the step, by a scale that does
not change inside the window). This runs both on CPU: the migrated program with
`torch.amp.GradScaler("cpu")` and an emulation of apex's unscale-every-micro-step (stash the
accumulated gradients, backward of `loss * scale`, then `grad = new / scale + stashed`, as apex's
`unscale_with_stashed` does), and compares the parameters after several optimizer steps, and the
norms the clip returned. The idiomatic form (the clip once per step, after `unscale_`), offered as
an unsafe fix, does not match: that is why it is unsafe.
"""

from __future__ import annotations

import pytest
import torch

from conftest import check, fix

SCALE = 2.0**16  # GradScaler's and apex's initial loss scale
ACCUMULATION = 4
STEPS = 3  # optimizer steps (ACCUMULATION micro-steps each)

APEX = '''import torch
from apex import amp


def train(model, loader, optimizer, accumulation_steps, threshold, log):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / accumulation_steps
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        CLIP
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
'''
CLIPS = {
    "norm": "log.append(float(torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), threshold)))",
    "value": "torch.nn.utils.clip_grad_value_(amp.master_params(optimizer), threshold)",
}
THRESHOLDS = {"norm": 0.05, "value": 0.01}


def _source(kind: str) -> str:
    return APEX.replace("CLIP", CLIPS[kind])


def _migrated(kind: str, **options) -> str:
    fixed = fix(_source(kind), **options)
    assert "apex" not in fixed
    return fixed.replace('"cuda"', '"cpu"')  # the same program on the CPU


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _data():
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator))
        for _ in range(ACCUMULATION * STEPS)
    ]


def _apex_emulation(kind: str):
    """What apex O1 did: unscale (and add to the stashed sum) after every backward, clip the
    unscaled sum, step every ACCUMULATION micro-steps."""

    def train(model, loader, optimizer, accumulation_steps, threshold, log):
        params = list(model.parameters())
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x), y) / accumulation_steps
            stashed = [p.grad for p in params]
            for p in params:
                p.grad = None
            (loss.float() * SCALE).backward()
            for p, old in zip(params, stashed):
                new = p.grad * (1.0 / SCALE)
                assert torch.isfinite(new).all()  # no overflow: every step is taken
                p.grad = new if old is None else new + old
            if kind == "norm":
                log.append(float(torch.nn.utils.clip_grad_norm_(params, threshold)))
            else:
                torch.nn.utils.clip_grad_value_(params, threshold)
            if (i + 1) % accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()

    return train


def _run(kind: str, train):
    if isinstance(train, str):
        namespace: dict = {}
        exec(compile(train, "train.py", "exec"), namespace)
        train = namespace["train"]
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    log: list = []
    train(model, _data(), optimizer, ACCUMULATION, THRESHOLDS[kind], log)
    return [p.detach().clone() for p in model.parameters()], log


def _close(a, b) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["norm", "value"])
def test_the_safe_fix_scales_the_threshold(kind):
    migrated = _migrated(kind)
    assert "threshold * scaler.get_scale()" in migrated
    assert "unscale_" not in migrated
    assert check(migrated.replace('"cpu"', '"cuda"'), select=["AMP1", "AMP3"]) == []
    assert fix(migrated) == migrated


@pytest.mark.parametrize("kind", ["norm", "value"])
def test_the_safe_fix_trains_exactly_like_apex(kind):
    apex_params, apex_log = _run(kind, _apex_emulation(kind))
    migrated_params, migrated_log = _run(kind, _migrated(kind))
    assert _close(apex_params, migrated_params)
    if kind == "norm":
        assert any(norm > THRESHOLDS[kind] for norm in apex_log)  # the clip is active
        assert len(migrated_log) == len(apex_log) == ACCUMULATION * STEPS
        assert migrated_log == pytest.approx(apex_log, rel=1e-5)
    # Without the scaled threshold the same migration clips the scaled gradients: far off.
    naive = _migrated(kind).replace(" * scaler.get_scale()", "").replace(" / scaler.get_scale()", "")
    naive_params, _ = _run(kind, naive)
    assert not _close(apex_params, naive_params)


def test_the_unsafe_alternative_clips_once_per_step():
    source = APEX.replace("CLIP", "torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), threshold)")
    findings = check(source, select=["AMP1"])
    moved = fix(source, **{"unsafe-fixes": True, "target-dtype": "float16", "select": ["AMP1", "AMP3"]})
    assert "apex" not in moved, moved
    lines = [line.strip() for line in moved.splitlines()]
    step = lines.index("if (i + 1) % accumulation_steps == 0:")
    assert lines[step + 1 : step + 4] == [
        "scaler.unscale_(optimizer)",
        'torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], threshold)',
        "scaler.step(optimizer)",
    ]
    assert all(f.fix is not None and f.fix.applicability == "safe" for f in findings if f.code == "AMP101")
    assert check(moved, select=["AMP1", "AMP3"]) == []
    assert fix(moved, **{"unsafe-fixes": True, "target-dtype": "float16"}) == moved
    # It changes numerics: the clip now acts once, on the summed gradients.
    apex_params, _ = _run("norm", _apex_emulation("norm"))
    moved_params, _ = _run("norm", moved.replace('"cuda"', '"cpu"'))
    assert not _close(apex_params, moved_params)


def test_another_read_on_every_micro_step_stays_refused_with_its_reason():
    source = APEX.replace("CLIP", "log.append(get_grad_norm(amp.master_params(optimizer)))")
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)
    reason = findings[0].no_fix_reason
    assert "`get_grad_norm(...)` is not torch's `clip_grad_norm_`/`clip_grad_value_`" in reason
    assert "if (i + 1) % accumulation_steps == 0" in reason


def test_a_norm_type_that_may_not_scale_is_refused():
    source = APEX.replace("CLIP", "torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), threshold, norm_type=p)")
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)
    assert "norm_type=p" in findings[0].no_fix_reason
