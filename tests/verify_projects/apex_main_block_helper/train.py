"""A CPU-sized multi-view-stereo-shaped training script written for ampmigrate's tests: its setup
helper `distribute_model(args)` builds the model, the optimizer and the loader, and sets apex up
under a test of a global of the script and of its arguments; the `if __name__ == "__main__":` block
calls it, then `main()`, which scales the loss. The data are synthetic: a regression on 16 features.

    python train.py --apex --opt-level O1
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--apex", action="store_true")
parser.add_argument("--opt-level", type=str, default="O1", choices=["O0", "O1", "O2"])
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

if args.apex:
    import apex.amp as amp

is_single_process = int(os.environ.get("WORLD_SIZE", "1")) == 1


def main(args, model, optimizer, loader):
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.smooth_l1_loss(model(x), y)
            if is_single_process and args.apex:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


def distribute_model(args):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if is_single_process:
        if args.apex:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    features = torch.randn(512, 16)
    targets = features[:, :4].sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(features.to(device), targets.to(device)), batch_size=32, shuffle=True)
    return model, optimizer, loader


if __name__ == "__main__":
    model, optimizer, loader = distribute_model(args)
    main(args, model, optimizer, loader)
