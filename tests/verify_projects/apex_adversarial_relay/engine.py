"""The training functions of the adversarial-training script (see train.py)."""

import torch
import torch.nn.functional as F
from apex import amp


def train_one_epoch(model, optimizer, loader, device, eps):
    model.train()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        delta = torch.zeros_like(x, requires_grad=True)
        loss = F.cross_entropy(model(x + delta), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            grad = torch.autograd.grad(scaled_loss, delta)[0]
            grad /= scaled_loss / loss  # back to the unscaled input gradient
        delta = (eps * grad.sign()).detach()
        loss = F.cross_entropy(model(x + delta), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
            if step % 8 == 0:
                print(f"step {step} loss {loss.item():.4f} scaled {scaled_loss.item():.1f}")
        optimizer.step()


def fit(model, optimizer, loader, device, epochs=3, eps=0.1):
    for epoch in range(epochs):
        train_one_epoch(model, optimizer, loader, device, eps)
