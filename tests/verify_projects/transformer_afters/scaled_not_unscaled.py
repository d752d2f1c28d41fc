"""A broken migration of examples/legacy_transformer/train.py: scaled, never unscaled.

The loss is scaled, but the step bypasses the scaler, so AdamW steps on gradients multiplied by
the loss scale and nothing checks them for overflow. Adam normalises a constant gradient scale
away, so the loss curve barely moves; `verify` must still report it as not equivalent.

    python train.py --epochs 2 --batch-size 32
"""

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import TinyGPT


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="checkpoint.pt")
    parser.add_argument("--log-every", type=int, default=50)
    return parser.parse_args()


def synthetic_corpus(samples, seq_len, vocab, seed=1234):
    """Token sequences from a fixed random Markov chain with peaked transitions.

    The chain (and so the dataset) is the same for every run, like a dataset on disk; a model
    that learns the transitions gets well below the uniform loss log(vocab).
    """
    gen = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(torch.randn(vocab, vocab, generator=gen) * 3.0, dim=-1)
    tokens = torch.empty(samples, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (samples,), generator=gen)
    for t in range(1, seq_len + 1):
        tokens[:, t] = torch.multinomial(transitions[tokens[:, t - 1]], 1, generator=gen).squeeze(1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def cosine_with_warmup(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True

    loader = DataLoader(
        synthetic_corpus(args.samples, args.seq_len, args.vocab),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
    )
    model = TinyGPT(args.vocab, d_model=args.width, n_layers=args.layers, max_len=args.seq_len).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = cosine_with_warmup(optimizer, args.warmup, args.epochs * len(loader))
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        started = time.time()
        for inputs, targets in loader:
            inputs, targets = inputs.cuda(non_blocking=True), targets.cuda(non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.amp.autocast("cuda", enabled=args.amp):
                logits = model(inputs)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")
        print(f"epoch {epoch} done in {time.time() - started:.1f}s")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "epoch": epoch,
            },
            args.out,
        )
    if os.path.exists(args.out):
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
