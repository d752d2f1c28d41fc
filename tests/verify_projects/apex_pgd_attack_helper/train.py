"""A CPU-sized PGD adversarial-training script written for ampmigrate's tests: apex set up here,
each step's adversarial inputs from `attacks.attack_pgd`, which is handed the optimizer and scales
its own loss with apex (another file), then this script's own scaled training step. The data are
synthetic: a 4-class classification on 16 features.

    python train.py --opt-level O1
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp
from torch.utils.data import DataLoader, TensorDataset

from attacks import attack_pgd, robust_accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--attack-iters", type=int, default=3)
    parser.add_argument("--opt-level", type=str, default="O1", choices=["O0", "O1", "O2"])
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level=args.opt_level, loss_scale=1.0, verbosity=0)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            delta = attack_pgd(model, x, y, args.epsilon, args.alpha, args.attack_iters, opt)
            output = model(x + delta)
            loss = F.cross_entropy(output, y)
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            opt.step()
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    x, y = features[:128].to(device), classes[:128].to(device)
    print(f"robust accuracy {robust_accuracy(model, x, y, args.epsilon, args.alpha, args.attack_iters):.3f}")


if __name__ == "__main__":
    main()
