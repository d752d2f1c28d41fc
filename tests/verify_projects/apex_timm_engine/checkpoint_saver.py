"""A checkpoint saver of apex_timm_engine, after timm's: the loss scaler's state beside the model's."""
import os

import torch


class CheckpointSaver:
    def __init__(self, model, optimizer, args=None, amp_scaler=None, checkpoint_dir=""):
        self.model = model
        self.optimizer = optimizer
        self.args = args
        self.amp_scaler = amp_scaler
        self.checkpoint_dir = checkpoint_dir

    def save(self, epoch, metric=None):
        state = {"epoch": epoch, "metric": metric, "state_dict": self.model.state_dict()}
        state["optimizer"] = self.optimizer.state_dict()
        if self.amp_scaler is not None:
            state[self.amp_scaler.state_dict_key] = self.amp_scaler.state_dict()
        torch.save(state, os.path.join(self.checkpoint_dir, "last.pth"))
