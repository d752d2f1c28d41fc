"""A CPU-sized training script written for ampmigrate's tests, after a shape common in Kaggle
solutions: one function runs an epoch in any mode (`run_nn(mode, model, loader, criterion=None,
optim=None, apex=None)`), trains when `mode == "train"` and scales the loss with apex only
`if apex:`; `train()` sets apex up and calls it to train and to validate, and `evaluate()`, called by
`main()` after training, calls it with `mode="valid"` and nothing else. The data are synthetic
16-feature samples of 4 classes.

    python train.py --apex
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--apex", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--n_grad_acc", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
NUM_CLASSES = 4
centers = torch.randn(NUM_CLASSES, 16) * 2
labels = torch.randint(0, NUM_CLASSES, (640,))
features = centers[labels] + torch.randn(640, 16)
train_set = TensorDataset(features[:512], labels[:512])
valid_set = TensorDataset(features[512:], labels[512:])
device = "cuda" if torch.cuda.is_available() else "cpu"


def run_nn(mode, model, loader, criterion=None, optim=None, apex=None):
    model.train(mode == "train")
    losses = []
    for i, (inputs, targets) in enumerate(loader):
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        losses.append(loss.item())
        if mode in ["train"]:
            if apex:
                with amp.scale_loss(loss, optim) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            if (i + 1) % args.n_grad_acc == 0:
                optim.step()
                optim.zero_grad()
    return sum(losses) / len(losses)


def train(model, criterion):
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.apex:
        model, optim = amp.initialize(model, optim, opt_level="O1")
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    valid_loader = DataLoader(valid_set, batch_size=args.batch_size)
    for epoch in range(args.epochs):
        run_nn("train", model, train_loader, criterion, optim=optim, apex=args.apex)
        with torch.no_grad():
            print(f"epoch {epoch} valid loss {run_nn('valid', model, valid_loader, criterion):.4f}")
    return model


def evaluate(model, criterion):
    with torch.no_grad():
        return run_nn("valid", model, DataLoader(valid_set, batch_size=args.batch_size), criterion)


def main():
    criterion = nn.CrossEntropyLoss()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES)).to(device)
    model = train(model, criterion)
    print(f"final valid loss {evaluate(model, criterion):.4f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
