"""Regression with float16 mixed precision whose mixed-precision step relies on the GradScaler to
skip inf/NaN steps, while the fp32 branch guards its own step (issue 16). One sample is corrupt.

    python train.py [--fp32]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_data(samples=1024, features=16, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    y = torch.tanh(x @ w)
    x[300, 0] = float("inf")  # a corrupt sample: the step that sees it has no finite gradients
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    use_amp = not args.fp32

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(make_data(), batch_size=32, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device)

    for epoch in range(4):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            if use_amp:
                with torch.autocast(device_type=device, dtype=torch.float16):
                    loss = F.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss = F.mse_loss(model(x), y)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if torch.isfinite(norm):
                    optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
