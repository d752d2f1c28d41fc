"""The training epoch of tests/verify_projects/apex_module_passed_to_trainer: it receives apex's
amp module from train.py in `amp` (None where mixed precision is off), as stereo-transformer's
`train_one_epoch` does, and clips the gradients after the scaled backward."""

import torch
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer, device, max_norm=0.0, amp=None):
    model.train()
    total = 0.0
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        output = model(x)
        loss = F.cross_entropy(output, y)
        optimizer.zero_grad()
        if amp is not None:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        total += loss.item()
    return total / len(loader)
