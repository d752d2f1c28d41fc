"""A CPU-sized training script written for ampmigrate's tests, after cascade-stereo's and
TransMVSNet's train.py: the settings exist only under `if __name__ == "__main__":`, which parses
them and sets apex up under `if args.using_apex:` with the opt level and loss scale given on the
command line; the training is in module-level functions called from that block, which read apex's
amp as a module global. The data are synthetic: a 4-class classification on 16 features.

    python train.py --using_apex --opt-level O1
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--using_apex", action="store_true")
parser.add_argument("--opt-level", type=str, default="O0")
parser.add_argument("--loss-scale", type=str, default=None)
parser.add_argument("--epochs", type=int, default=3)


def train_sample(model, optimizer, x, y, args):
    model.train()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    if args.using_apex:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
    return loss.item()


def train(model, optimizer, loader, args):
    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = train_sample(model, optimizer, x, y, args)
            step += 1
            if step % 20 == 0:
                print(f"step {step} loss {loss:.4f}")


if __name__ == "__main__":
    args = parser.parse_args()
    if args.using_apex:
        from apex import amp
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.using_apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, loss_scale=args.loss_scale)
    train(model, optimizer, loader, args)
