"""A CPU-sized training script written for ampmigrate's tests: it builds the trainer of
trainer.py, switches mixed precision on with its property setter, trains and validates. The data
are synthetic: a 4-class classification on 16 features.

    python train.py --mixed-precision
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mixed-precision", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16, device=device)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss())
    trainer.mixed_precision = args.mixed_precision
    for epoch in range(args.epochs):
        trainer.train_for(loader, epoch)
        print(f"epoch {epoch} validation loss {trainer.validate_for(loader):.4f}")


if __name__ == "__main__":
    main()
