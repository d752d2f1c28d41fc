#!/usr/bin/env python
"""Written for ampmigrate's tests (no repository reduced): a runner base class that builds the
optimizer and calls `amp.initialize` in its `__init__` under `--fp16` (engine/base.py), and a
subclass in another module that scales the loss in its `train_epoch()` method with the optimizer
the base set up (engine/classifier.py), clipping `amp.master_params(self.optimizer)`. A
bag-of-embeddings multi-label classifier on synthetic token ids, CPU-sized.

    python train.py --fp16 --fp16_opt_level O1
"""

import argparse

import torch
from torch import nn

from engine.classifier import ClassifierRunner


class BagClassifier(nn.Module):
    def __init__(self, vocab=200, dim=32, labels=6):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, labels)

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.embed(tokens))))


def make_batches(count, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, 200, (batch_size, 12), generator=gen)
        labels = (torch.rand(batch_size, 6, generator=gen) > 0.7).float()
        batches.append((tokens, labels))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true", default=True)
    parser.add_argument("--fp32", dest="fp16", action="store_false")
    parser.add_argument("--fp16_opt_level", default="O1")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    runner = ClassifierRunner(args, BagClassifier())
    runner.train(make_batches(20, 16))


if __name__ == "__main__":
    main()
