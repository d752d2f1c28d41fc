#!/usr/bin/env python
"""A GPU-check project for `ampmigrate verify` (bench/gpu/RESULTS.md), written for ampmigrate: the
shape of an SSD training script (corpus Z) reduced to a tiny detector on synthetic images. apex is
set up only under `if torch.cuda.is_available():` and `if opt.amp:`, inside `main()`; the epoch
function of process.py scales the loss under its `is_amp` flag.

    python train.py --amp
"""

import argparse

import torch
from torch import nn

from process import train


class TinySSD(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU())
        self.loc = nn.Conv2d(16, 4, 3, padding=1)
        self.conf = nn.Conv2d(16, num_classes, 3, padding=1)

    def forward(self, x):
        f = self.features(x)
        return self.loc(f).flatten(2), self.conf(f).flatten(2)


class Criterion(nn.Module):
    def forward(self, ploc, plabel, gloc, glabel):
        return nn.functional.smooth_l1_loss(ploc, gloc) + nn.functional.cross_entropy(plabel, glabel)


def make_loader(batches, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    loader = []
    for _ in range(batches):
        img = torch.randn(batch_size, 3, 16, 16, generator=gen)
        gloc = torch.randn(batch_size, 4, 64, generator=gen)
        glabel = torch.randint(0, 4, (batch_size, 64), generator=gen)
        loader.append((img, gloc, glabel))
    return loader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=40)
    opt = parser.parse_args()
    torch.manual_seed(0)
    model = TinySSD()
    criterion = Criterion()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_loader = make_loader(opt.batches, 8)

    if torch.cuda.is_available():
        model.cuda()
        criterion.cuda()

        if opt.amp:
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level='O1')

    for epoch in range(opt.epochs):
        train(model, train_loader, epoch, criterion, optimizer, opt.amp)


if __name__ == "__main__":
    main()
