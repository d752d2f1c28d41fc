"""Train an MLP classifier on synthetic Gaussian blobs with fp16 mixed precision.

    python train.py --config config.json --out runs/mlp
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader, TensorDataset

from net import MLP


def make_blobs(samples, features, classes, seed=7):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=gen) * 0.6
    labels = torch.randint(classes, (samples,), generator=gen)
    points = centers[labels] + torch.randn(samples, features, generator=gen)
    return TensorDataset(points, labels)


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast():
            correct += (model(x).argmax(dim=1) == y).sum().item()
        total += y.numel()
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config.json")
    parser.add_argument("--out", default="runs/mlp")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open(args.config) as handle:
        cfg = json.load(handle)

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = make_blobs(cfg["samples"], cfg["features"], cfg["classes"])
    train_loader = DataLoader(data, batch_size=cfg["batch_size"], shuffle=True)
    eval_loader = DataLoader(data, batch_size=512)

    model = MLP(cfg["features"], cfg["hidden"], cfg["classes"]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    scaler = GradScaler()
    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, "last.pt")

    for epoch in range(cfg["epochs"]):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        accuracy = evaluate(model, eval_loader, device)
        print(f"epoch {epoch}: loss {loss.item():.4f} accuracy {accuracy:.3f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, checkpoint)
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])


if __name__ == "__main__":
    main()
