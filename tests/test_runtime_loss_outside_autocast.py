"""AMP307's claim on real torch (CPU, float16 autocast): a loss computed after the autocast block
on its outputs runs in float16; after `ampmigrate fix` moves it into the block it runs in float32."""

from __future__ import annotations

import torch

from conftest import check, codes, fix

TRAIN = '''import torch
import torch.nn as nn


def train(model, loader, optimizer, log):
    criterion = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cpu")
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(x)
        loss = criterion(logits, y)
        log.append(loss.dtype)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
'''


def _loss_dtypes(source: str):
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    loader = [(torch.randn(16, 8), torch.randint(0, 4, (16,))) for _ in range(2)]
    log: list = []
    namespace["train"](model, loader, torch.optim.SGD(model.parameters(), lr=0.1), log)
    return log


def test_loss_runs_in_float16_before_and_float32_after_the_fix():
    assert codes(check(TRAIN)) == ["AMP307"]
    fixed = fix(TRAIN)
    assert "            loss = criterion(logits, y)\n" in fixed  # moved into the block
    assert _loss_dtypes(TRAIN) == [torch.float16, torch.float16]
    assert _loss_dtypes(fixed) == [torch.float32, torch.float32]
