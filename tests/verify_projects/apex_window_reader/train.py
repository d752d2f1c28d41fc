"""apex O1 training whose step also reads the gradients through code of the same file: a weight
noise "attack" that moves each weight a little along its raw gradient after the backward (the
shape of adversarial weight perturbation and gradient loggers), and a gradient-norm log line.
With apex both read unscaled gradients: the scale was gone when the `scale_loss` block ended.
`--adversarial` adds a second, plain backward after the nudge (an adversarial loss at the nudged
weights, the FGM shape): apex added its gradients at scale 1 to the unscaled ones."""

import argparse

import torch
from apex import amp
from torch import nn


class WeightNudge:
    def __init__(self, model, epsilon):
        self.model = model
        self.epsilon = epsilon

    def nudge(self):
        for param in self.model.parameters():
            if param.grad is not None:
                param.data.add_(self.epsilon * param.grad)


def gradient_linf(model):
    return max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)


def make_data(samples=2048, features=16, seed=3):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(features, 4, generator=gen)
    x = torch.randn(samples, features, generator=gen)
    return x, (x @ weights).argmax(dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--adversarial", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = make_data()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    nudge = WeightNudge(model, args.epsilon)
    step = 0
    for epoch in range(5):
        order = torch.randperm(len(x))
        for start in range(0, len(x), 32):
            index = order[start : start + 32]
            inputs, targets = x[index].cuda(), y[index].cuda()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f} grad linf {gradient_linf(model):.4f}")
            nudge.nudge()
            if args.adversarial:
                loss_adv = 0.5 * nn.functional.cross_entropy(model(inputs), targets)
                loss_adv.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            step += 1


if __name__ == "__main__":
    main()
