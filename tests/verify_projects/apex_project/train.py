"""Legacy apex O1 training of a small regression model (apex.amp no longer exists)."""

import torch
from apex import amp
from torch import nn


def make_data(samples=1024, features=16, seed=3):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(features, 1, generator=gen)
    x = torch.randn(samples, features, generator=gen)
    return x, x @ weights + 0.1 * torch.randn(samples, 1, generator=gen)


def main():
    torch.manual_seed(0)
    x, y = make_data()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for epoch in range(10):
        order = torch.randperm(len(x))
        for start in range(0, len(x), 32):
            index = order[start : start + 32]
            inputs, targets = x[index].cuda(), y[index].cuda()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, "apex_model.pt")


if __name__ == "__main__":
    main()
