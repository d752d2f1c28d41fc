#!/usr/bin/env python
"""Written for ampmigrate's tests (no repository reduced): a script that builds its model through a
registry (`MODELS[name](config)`, which the tool cannot follow to a class) and sets apex up on the
object's own optimizer, `model, model.optimizer = amp.initialize(model, model.optimizer)`; the model
class owns that optimizer and runs its training step in `update()` (models/regressor.py). A
regression on a synthetic smooth target, CPU-sized.

    python train.py --fp16
"""

import argparse

import torch

from models.regressor import MODELS

try:
    from apex import amp
except ImportError:
    amp = None


def make_batches(count, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        x = torch.randn(batch_size, 16, generator=gen)
        y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]
        batches.append((x, y))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true", default=True)
    parser.add_argument("--fp32", dest="fp16", action="store_false")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = {"lr": 0.02, "fp16": args.fp16}
    model = MODELS["regressor"](config).to(args.device)
    if args.fp16:
        model, model.optimizer = amp.initialize(model, model.optimizer, opt_level="O1")
    batches = make_batches(20, 32)
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in batches:
            total += model.update(x.to(args.device), y.to(args.device))
        print(f"epoch {epoch} loss {total / len(batches):.4f}")


if __name__ == "__main__":
    main()
