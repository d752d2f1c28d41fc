"""Written for ampmigrate's tests (no repository reduced): a setup helper that moves the model to
its device and sets apex up for fp16 training, returning the model and the optimizer, as
retrieval and fine-tuning code bases do (`setup_for_distributed_mode(model, optimizer, device,
n_gpu, local_rank, fp16, fp16_opt_level)`); the training script (train.py) scales the loss."""

import torch
from torch import nn


def setup_for_training(model: nn.Module, optimizer, device, n_gpu=1, fp16=False, fp16_opt_level="O1"):
    model.to(device)
    if fp16:
        try:
            from apex import amp
        except ImportError:
            raise ImportError("Please install apex to use fp16 training.")
        model, optimizer = amp.initialize(model, optimizer, opt_level=fp16_opt_level)
    if n_gpu > 1:
        model = torch.nn.DataParallel(model)
    return model, optimizer


def move_to(batch, device):
    return tuple(t.to(device) for t in batch)
