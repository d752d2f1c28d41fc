#!/usr/bin/env python
"""Written for ampmigrate's tests (no repository reduced): a dual-encoder retrieval trainer whose
apex setup is in a helper of another module (model_utils.setup_for_training); this script calls
it, then scales the loss with `amp.scale_loss` and clips `amp.master_params(optimizer)`. In-batch
negatives over synthetic token ids, CPU-sized.

    python train.py --fp16 --fp16_opt_level O1
"""

import argparse

import torch
from torch import nn

from model_utils import move_to, setup_for_training

try:
    from apex import amp
except ImportError:
    amp = None


class Encoder(nn.Module):
    def __init__(self, vocab=300, dim=32):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def forward(self, tokens):
        return self.proj(self.embed(tokens))


class BiEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.question = Encoder()
        self.context = Encoder()

    def forward(self, questions, contexts):
        return self.question(questions), self.context(contexts)


def make_batches(count, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        questions = torch.randint(0, 300, (batch_size, 10), generator=gen)
        contexts = torch.cat([questions[:, :5], torch.randint(0, 300, (batch_size, 15), generator=gen)], dim=1)
        batches.append((questions, contexts))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true", default=True)
    parser.add_argument("--fp32", dest="fp16", action="store_false")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max_grad_norm", type=float, default=2.0)
    parser.add_argument("--fp16_opt_level", default="O1")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = BiEncoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = setup_for_training(model, optimizer, args.device, 1, args.fp16, args.fp16_opt_level)

    model.train()
    for epoch in range(args.epochs):
        for batch in make_batches(20, 16, seed=epoch):
            questions, contexts = move_to(batch, args.device)
            q, c = model(questions, contexts)
            scores = q @ c.t()
            loss = nn.functional.cross_entropy(scores, torch.arange(q.size(0), device=scores.device))
            optimizer.zero_grad()
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
