"""The training and evaluation loops of apex_timm_engine (DeiT-style `engine.py`)."""
from contextlib import suppress

import torch


def train_one_epoch(model, loader, optimizer, loss_fn, args, amp_autocast=suppress, loss_scaler=None):
    model.train()
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
        with amp_autocast():
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters(), create_graph=False)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()


def evaluate(model, loader, amp_autocast=suppress):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.cuda(), labels.cuda()
            with amp_autocast():
                output = model(images)
            correct += (output.argmax(dim=1) == labels).sum().item()
            total += labels.numel()
    model.train()
    return correct / max(total, 1)
