"""An image classifier trained the apex.amp way (O1), as countless 2019-2021 repositories did.

apex.amp was removed from apex in 2025, so this script no longer runs on a current stack:
`ampmigrate fix` turns it into torch.amp (fp16 autocast + GradScaler, same numerics), and
`ampmigrate fix --unsafe-fixes` into bf16 autocast without a scaler. Synthetic data, runs on a CPU.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


class SmallConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def synthetic_loader(batches, batch_size, generator):
    """Fixed random 'images' whose class is a linear function of the pixels (learnable)."""
    projection = torch.randn(3 * 16 * 16, 10, generator=generator)
    data = []
    for _ in range(batches):
        x = torch.randn(batch_size, 3, 16, 16, generator=generator)
        data.append((x, (x.flatten(1) @ projection).argmax(1)))
    return data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--out", default="checkpoints")
    args = parser.parse_args()

    loader = synthetic_loader(batches=16, batch_size=32, generator=torch.Generator().manual_seed(0))
    model = SmallConvNet().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            images, labels = images.cuda(), labels.cuda()
            optimizer.zero_grad()
            output = model(images)
            loss = F.cross_entropy(output, labels)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.clip)
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")

    os.makedirs(args.out, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()},
        os.path.join(args.out, "last.pt"),
    )


if __name__ == "__main__":
    main()
