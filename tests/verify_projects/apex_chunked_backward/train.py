"""A CPU-sized training script written for ampmigrate's tests, after the Transformer-XL training
loop (and its descendants, such as thu-coai/LaMemo's `train_ddp.py`): with `--batch-chunk N` each
batch runs as N chunks, each scaled and backpropagated, else as one; either arm falls back to a
plain backward without `--fp16`. One clip and one optimizer step follow both arms, and the clip
goes through `amp.master_params` only under O2. The data are synthetic: a regression on 16
features.

    python train.py --fp16 O1 --batch-chunk 2
"""

import argparse

import torch
import torch.nn as nn

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", type=str, default="")
parser.add_argument("--batch-chunk", type=int, default=1)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--clip", type=float, default=0.5)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
weights = torch.randn(16, 1)


def batch(size=64):
    data = torch.randn(size, 16)
    return data.to(device), (data @ weights + 0.1 * torch.randn(size, 1)).to(device)


def main():
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16)
    for step in range(args.steps):
        data, target = batch()
        optimizer.zero_grad()
        train_loss = 0.0
        if args.batch_chunk > 1:
            for data_i, target_i in zip(data.chunk(args.batch_chunk), target.chunk(args.batch_chunk)):
                loss = nn.functional.mse_loss(model(data_i), target_i) / args.batch_chunk
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                train_loss += loss.item()
        else:
            loss = nn.functional.mse_loss(model(data), target)
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            train_loss += loss.item()
        if args.fp16 == "O2":
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.clip)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {train_loss:.4f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
