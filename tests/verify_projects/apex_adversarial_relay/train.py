"""A CPU-sized adversarial-training script written for ampmigrate's tests, after the fast
adversarial training codebases: the script sets apex up and hands the optimizer to `fit()` in
engine.py, which relays it to the epoch function; there the input gradient of an FGSM step is
taken from apex's scaled loss (`torch.autograd.grad(scaled_loss, delta)`, then divided by the
scale) and the scaled loss of the training step is logged. The data are synthetic: a 4-class
classification on 16 features.

    python train.py --opt-level O1
"""

import argparse

import torch
import torch.nn as nn
from apex import amp
from torch.utils.data import DataLoader, TensorDataset

from engine import fit

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", type=str, default="O1")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--eps", type=float, default=0.1)


def main():
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    fit(model, optimizer, loader, device, epochs=args.epochs, eps=args.eps)


if __name__ == "__main__":
    main()
