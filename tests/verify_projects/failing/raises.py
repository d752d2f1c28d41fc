"""Trains for a few steps, then a shape bug in the loss raises (verify must exit 2 with the traceback)."""

import torch
from torch import nn


def regression_loss(prediction, target):
    if prediction.shape != target.shape:
        raise ValueError(f"prediction {tuple(prediction.shape)} and target {tuple(target.shape)} differ")
    return nn.functional.mse_loss(prediction, target)


def main():
    model = nn.Linear(8, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    for step in range(100):
        x = torch.randn(32, 8).cuda()
        target = x.sum(dim=1, keepdim=True)
        if step == 5:
            target = target.squeeze(1)  # the bug
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            loss = regression_loss(model(x).float(), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


if __name__ == "__main__":
    main()
