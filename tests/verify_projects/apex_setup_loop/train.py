"""A CPU-sized training script written for ampmigrate's tests, after two shapes common in real
apex code: sentence-transformers' old `fit()`, which trains several objectives, each with its own
model and optimizer, set up for apex in a loop before training; and apex's ImageNet example's
command line, where `--opt-level`, `--keep-batchnorm-fp32` and `--loss-scale` reach
`amp.initialize` as strings (or None). The data are synthetic: a 4-class classification and a
regression on 16 features.

    python train.py --fp16 --loss-scale 128
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--opt-level", type=str, default="O1")
parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
parser.add_argument("--loss-scale", type=str, default=None)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(512, 16)
classes = (features[:, :4].argmax(dim=1)).long()
values = features[:, 4:8].sum(dim=1, keepdim=True) * 0.5


def batches(dataset):
    while True:
        yield from DataLoader(dataset, batch_size=args.batch_size, shuffle=True)


def fit(objectives, steps, fp16, max_grad_norm=1.0):
    loss_models = [model for model, _, _ in objectives]
    optimizers = [torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9) for model in loss_models]
    if fp16:
        for idx in range(len(loss_models)):
            model, optimizer = amp.initialize(loss_models[idx], optimizers[idx],
                                              opt_level=args.opt_level,
                                              keep_batchnorm_fp32=args.keep_batchnorm_fp32,
                                              loss_scale=args.loss_scale)
            loss_models[idx] = model
            optimizers[idx] = optimizer

    data = [batches(dataset) for _, dataset, _ in objectives]
    for step in range(steps * len(objectives)):
        idx = step % len(objectives)
        model, optimizer, criterion = loss_models[idx], optimizers[idx], objectives[idx][2]
        inputs, targets = next(data[idx])
        loss = criterion(model(inputs.to(device)), targets.to(device))
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_grad_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            print(f"step {step} objective {idx} loss {loss.item():.4f}")


def main():
    classifier = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    regressor = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    objectives = [
        (classifier, TensorDataset(features, classes), nn.CrossEntropyLoss()),
        (regressor, TensorDataset(features, values), nn.MSELoss()),
    ]
    steps = args.epochs * len(features) // args.batch_size
    fit(objectives, steps, args.fp16)
    torch.save({"classifier": classifier.state_dict(), "regressor": regressor.state_dict()}, "model.pt")


if __name__ == "__main__":
    main()
