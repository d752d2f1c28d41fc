"""A CPU-sized script written for ampmigrate's tests: apex is set up here only under `--apex`
(`amp = None` otherwise), and its amp module is handed to the training epoch of another file,
`engine.train.train_one_epoch(..., amp)`, as stereo-transformer's main.py does. The data are
synthetic: a 4-class classification on 16 features.

    python train.py --apex
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from engine.train import train_one_epoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--clip-max-norm", type=float, default=1.0)
    parser.add_argument("--apex", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.apex:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    else:
        amp = None
    for epoch in range(args.epochs):
        loss = train_one_epoch(model, loader, optimizer, device, args.clip_max_norm, amp)
        print(f"epoch {epoch} loss {loss:.4f}")


if __name__ == "__main__":
    main()
