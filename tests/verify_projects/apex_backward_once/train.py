"""A CPU-sized training script written for ampmigrate's tests, after incremental-learning code
(MiB-style): a module-level `backward(loss, optimizer, fp16)` holds the apex switch and is called
once by `train_epoch()`, which clips and steps after it; with `--distill` a frozen old model joins
`amp.initialize` in one arm of `if model_old is not None:`, the model alone in the other. The data
are synthetic: a 4-class problem on 16 features.

    python train.py --fp16 [--distill]
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from apex import amp
except ImportError:
    amp = None

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--distill", action="store_true")
parser.add_argument("--opt-level", default="O2")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def backward(loss, optimizer, fp16=False):
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()


def batches(weights):
    while True:
        x = torch.randn(args.batch_size, 16)
        yield x, (x @ weights).argmax(dim=1)


def train_epoch(model, model_old, optimizer, loader, steps):
    model.train()
    for step in range(steps):
        x, y = next(loader)
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if model_old is not None:
            with torch.no_grad():
                old = model_old(x)
            loss = loss + 0.5 * F.mse_loss(logits.float(), old.float())
        optimizer.zero_grad()
        backward(loss, optimizer, args.fp16)
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer) if args.fp16 else model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")


def main():
    model = make_model().to(device)
    model_old = None
    if args.distill:
        model_old = make_model().to(device)
        model_old.eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.fp16:
        assert amp is not None, "apex is needed for mixed precision training"
        if model_old is not None:
            [model, model_old], optimizer = amp.initialize([model, model_old], optimizer, opt_level=args.opt_level)
        else:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    loader = batches(torch.randn(16, 4))
    train_epoch(model, model_old, optimizer, loader, args.steps)
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
