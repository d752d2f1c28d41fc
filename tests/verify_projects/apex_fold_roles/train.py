"""A CPU-sized training script written for ampmigrate's tests, after center-loss re-identification
and Kaggle fold code: each fold builds its model, a center-loss module, the model's optimizer
(chosen by an `if`/`elif` on `--optim` with no `else`) and the centers' one, hands both to
`amp.initialize`, and trains with them kept in a dict by role, scaling the loss with
`[optimizers["net"], optimizers["center"]]`. The data are synthetic 16-feature samples of 4 classes.

    python train.py --fp16 [--optim adam]
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--optim", default="sgd")
parser.add_argument("--folds", type=int, default=2)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class CenterLoss(nn.Module):
    def __init__(self, classes, dim):
        super().__init__()
        self.centers = nn.Parameter(torch.randn(classes, dim))

    def forward(self, features, labels):
        return ((features.float() - self.centers[labels]) ** 2).sum(dim=1).mean()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        features = self.body(x)
        return features, self.head(features)


def batches(weights):
    while True:
        x = torch.randn(32, 16)
        yield x.to(device), (x @ weights).argmax(dim=1).to(device)


def train(model, center_loss, optimizers, loader, steps):
    for step in range(steps):
        x, y = next(loader)
        features, logits = model(x)
        loss = F.cross_entropy(logits, y) + 0.01 * center_loss(features, y)
        optimizers["net"].zero_grad()
        optimizers["center"].zero_grad()
        with amp.scale_loss(loss, [optimizers["net"], optimizers["center"]]) as scaled_loss:
            scaled_loss.backward()
        optimizers["net"].step()
        optimizers["center"].step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")


def main():
    weights = torch.randn(16, 4)
    for fold in range(args.folds):
        model = Net().to(device)
        center_loss = CenterLoss(4, 32).to(device)
        center_optimizer = torch.optim.SGD(center_loss.parameters(), lr=0.1)
        if args.optim == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        elif args.optim == "adam":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        if args.fp16:
            model, [optimizer, center_optimizer] = amp.initialize(model, [optimizer, center_optimizer], opt_level="O1")
        optimizers = {"net": optimizer, "center": center_optimizer}
        train(model, center_loss, optimizers, batches(weights), args.steps)


if __name__ == "__main__":
    main()
