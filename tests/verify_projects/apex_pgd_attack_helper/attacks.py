"""The attack of a CPU-sized PGD adversarial-training project written for ampmigrate's tests, in the
shape of the fast adversarial training utilities: given the training optimizer, the attack scales
its loss with apex's amp (an input gradient: it never steps the optimizer); the evaluation calls
it without one.
"""

import torch
import torch.nn.functional as F
from apex import amp


def clamp(x, lower, upper):
    return torch.max(torch.min(x, upper), lower)


def attack_pgd(model, x, y, epsilon, alpha, iterations, opt=None):
    delta = torch.zeros_like(x).uniform_(-epsilon, epsilon)
    delta.requires_grad = True
    bound = torch.tensor(epsilon)
    for _ in range(iterations):
        output = model(x + delta)
        loss = F.cross_entropy(output, y)
        if opt is not None:
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        grad = delta.grad.detach()
        delta.data = clamp(delta + alpha * torch.sign(grad), -bound, bound)
        delta.grad.zero_()
    return delta.detach()


def robust_accuracy(model, x, y, epsilon, alpha, iterations):
    delta = attack_pgd(model, x, y, epsilon, alpha, iterations)
    with torch.no_grad():
        return (model(x + delta).argmax(dim=1) == y).float().mean().item()
