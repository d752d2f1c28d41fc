"""The apex migration of a gradient-norm helper of the program called on every micro-step of
gradient accumulation keeps apex's value.

Swin-Transformer logs `grad_norm = get_grad_norm(amp.master_params(optimizer))` after every
backward while stepping every N micro-steps. apex handed the helper unscaled gradients; GradScaler
keeps them multiplied by the scale S until the step. The helper is recognized by its structure as
a p-norm of the gradients (engine/grad_norm_helpers.py), which is positively homogeneous, so the
safe fix divides its value by `scaler.get_scale()`. This runs the migrated program on CPU
(`torch.amp.GradScaler("cpu")`) against an emulation of apex's unscale-every-micro-step (as in
tests/test_runtime_accumulation_clip.py) and compares the logged norms and the parameters.
"""

from __future__ import annotations

import pytest
import torch

from conftest import check, fix
from test_runtime_accumulation_clip import ACCUMULATION, SCALE, _close, _data, _model

LOOP_HELPER = '''
def get_grad_norm(parameters, norm_type=2):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(filter(lambda p: p.grad is not None, parameters))
    norm_type = float(norm_type)
    total_norm = 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
    total_norm = total_norm ** (1. / norm_type)
    return total_norm
'''
STACK_HELPER = '''
def get_grad_norm(parameters, norm_type=2.0):
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type).item()
'''
APEX = '''import torch
from apex import amp
HELPER

def train(model, loader, optimizer, accumulation_steps, log):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / accumulation_steps
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        grad_norm = get_grad_norm(amp.master_params(optimizer)CALL_ARGS)
        log.append(float(grad_norm))
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
'''
CASES = {
    "loop": (LOOP_HELPER, "", 2.0),
    "loop_p3": (LOOP_HELPER, ", norm_type=3", 3.0),
    "stack": (STACK_HELPER, "", 2.0),
}


def _source(case: str) -> str:
    helper, args, _ = CASES[case]
    return APEX.replace("HELPER", helper).replace("CALL_ARGS", args)


def _migrated(case: str) -> str:
    fixed = fix(_source(case))
    assert "apex" not in fixed, fixed
    return fixed.replace('"cuda"', '"cpu"')


def _apex_emulation(p: float):
    def train(model, loader, optimizer, accumulation_steps, log):
        params = list(model.parameters())
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x), y) / accumulation_steps
            stashed = [q.grad for q in params]
            for q in params:
                q.grad = None
            (loss.float() * SCALE).backward()
            for q, old in zip(params, stashed):
                new = q.grad * (1.0 / SCALE)
                assert torch.isfinite(new).all()
                q.grad = new if old is None else new + old
            log.append(float(sum(q.grad.norm(p).item() ** p for q in params) ** (1.0 / p)))
            if (i + 1) % accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()

    return train


def _run(train):
    if isinstance(train, str):
        namespace: dict = {}
        exec(compile(train, "train.py", "exec"), namespace)
        train = namespace["train"]
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    log: list = []
    train(model, _data(), optimizer, ACCUMULATION, log)
    return [q.detach().clone() for q in model.parameters()], log


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_safe_fix_divides_the_norm_by_the_scale(case):
    migrated = _migrated(case)
    assert "group[\"params\"]]) / scaler.get_scale()" in migrated or "group[\"params\"]], norm_type=3) / scaler.get_scale()" in migrated
    assert "unscale_" not in migrated
    assert check(migrated.replace('"cpu"', '"cuda"'), select=["AMP1", "AMP3"]) == []
    assert fix(migrated) == migrated


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_migrated_norm_is_apex_s(case):
    apex_params, apex_log = _run(_apex_emulation(CASES[case][2]))
    migrated_params, migrated_log = _run(_migrated(case))
    assert _close(apex_params, migrated_params)
    assert len(migrated_log) == len(apex_log) > 0
    assert migrated_log == pytest.approx(apex_log, rel=1e-5)
    # Without the division the migration logs the norm of the scaled gradients: S times apex's.
    _, naive_log = _run(_migrated(case).replace(" / scaler.get_scale()", ""))
    assert naive_log == pytest.approx([v * SCALE for v in apex_log], rel=1e-5)


LOOKALIKES = {
    "squared": LOOP_HELPER.replace("    total_norm = total_norm ** (1. / norm_type)\n", ""),
    "writes_grad": LOOP_HELPER.replace("        param_norm =", "        p.grad.data.clamp_(-1, 1)\n        param_norm ="),
    "offset": LOOP_HELPER.replace("total_norm = 0\n", "total_norm = 1e-6\n"),
    "mixed_norm_type": LOOP_HELPER.replace("param_norm.item() ** norm_type", "param_norm.item() ** 2"),
    "no_default_type": LOOP_HELPER.replace("norm_type=2)", "norm_type)"),
}


@pytest.mark.parametrize("case", sorted(LOOKALIKES))
def test_a_lookalike_helper_stays_refused(case):
    source = APEX.replace("HELPER", LOOKALIKES[case]).replace("CALL_ARGS", "")
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)
    assert "`get_grad_norm(...)` is not torch's" in findings[0].no_fix_reason


@pytest.mark.parametrize(
    "call_args", [", norm_type=p", ", float('inf')", ", 0", ", norm_type=-1", ", 2, 3", ", *extra"]
)
def test_a_call_whose_norm_type_may_not_scale_stays_refused(call_args):
    source = APEX.replace("HELPER", LOOP_HELPER).replace("CALL_ARGS", call_args)
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)


def test_a_discarded_call_stays_refused():
    source = APEX.replace("HELPER", LOOP_HELPER).replace("CALL_ARGS", "").replace(
        "        grad_norm = get_grad_norm(amp.master_params(optimizer))\n        log.append(float(grad_norm))\n",
        "        get_grad_norm(amp.master_params(optimizer))\n",
    )
    assert "        get_grad_norm(amp.master_params(optimizer))\n" in source
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)


def test_a_shadowed_helper_stays_refused():
    source = _source("loop").replace("    model, optimizer = amp.initialize", "    get_grad_norm = log.norm\n    model, optimizer = amp.initialize")
    findings = [f for f in check(source, select=["AMP1"]) if f.code == "AMP101"]
    assert findings and all(f.fix is None for f in findings)
