"""A CPU-sized FGSM adversarial-training script written for ampmigrate's tests, in the shape of the
fast adversarial training scripts: apex's options travel in a dict built before
`amp.initialize(model, opt, **amp_args)` (one of them only under O2), and each step takes the input
gradient from a scaled backward with no step of its own, then zeroes the gradients and takes the
training step. The data are synthetic: a 4-class classification on 16 features.

    python train.py --opt-level O1
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--alpha", type=float, default=0.125)
    parser.add_argument("--opt-level", type=str, default="O1", choices=["O0", "O1", "O2"])
    parser.add_argument("--loss-scale", type=str, default="1.0")
    parser.add_argument("--master-weights", action="store_true")
    return parser.parse_args()


def clamp(x, lower, upper):
    return torch.max(torch.min(x, upper), lower)


def main():
    args = get_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    amp_args = dict(opt_level=args.opt_level, loss_scale=args.loss_scale, verbosity=False)
    if args.opt_level == "O2":
        amp_args["master_weights"] = args.master_weights
    model, opt = amp.initialize(model, opt, **amp_args)
    epsilon = torch.tensor(args.epsilon)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            delta = torch.zeros_like(x).uniform_(-args.epsilon, args.epsilon)
            delta.requires_grad = True
            output = model(x + delta)
            loss = F.cross_entropy(output, y)
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            grad = delta.grad.detach()
            delta.data = clamp(delta + args.alpha * torch.sign(grad), -epsilon, epsilon)
            delta = delta.detach()
            output = model(x + delta)
            loss = F.cross_entropy(output, y)
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            opt.step()
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
