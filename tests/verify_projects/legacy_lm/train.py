"""A legacy character-level LM loop (fp16 autocast + GradScaler, AdamW), as written in 2020.

The clip runs on the scaled gradients (no `scaler.unscale_` before it): a real bug that
`ampmigrate fix` repairs (AMP301) while it migrates the precision (AMP201/AMP202, AMP401).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab, width=32, context=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(context * width, 2 * width)
        self.head = nn.Linear(2 * width, vocab)

    def forward(self, tokens):
        hidden = self.embed(tokens).flatten(1)
        return self.head(F.gelu(self.mix(hidden)))


def corpus(samples, context, vocab, seed=7):
    """Windows of a fixed random Markov chain (the same data for every run, like a file)."""
    gen = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(torch.randn(vocab, vocab, generator=gen) * 3.0, dim=-1)
    stream = [0]
    for _ in range(samples + context):
        stream.append(int(torch.multinomial(transitions[stream[-1]], 1, generator=gen)))
    stream = torch.tensor(stream)
    windows = stream.unfold(0, context + 1, 1)[:samples]
    return windows[:, :-1], windows[:, -1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=10000)
    args = parser.parse_args()
    vocab, context = 24, 4
    inputs, targets = corpus(4096, context, vocab)
    model = TinyLM(vocab, context=context).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scaler = torch.cuda.amp.GradScaler()
    for step in range(args.steps):
        index = torch.randint(len(inputs), (64,))
        x, y = inputs[index].cuda(), targets[index].cuda()
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(optimizer)
        scaler.update()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
