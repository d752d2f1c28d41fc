"""The base trainer of a CPU-sized project written for ampmigrate's tests, after flair's trainers
(as vendored in Alibaba-NLP/ACE): apex is imported in a `try` with `amp = None` as the fallback,
the model computes its own loss (`model.forward_loss(batch)`), and sibling trainers reach `amp`,
`torch` and the rest through `from trainer import *`."""

import sys

import torch
import torch.nn as nn

try:
    from apex import amp
except ImportError:
    amp = None


class Tagger(nn.Module):
    """A 4-class classifier on 16 features that computes its own losses."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x):
        return self.body(x)

    def forward_loss(self, batch):
        x, y = batch
        return self.criterion(self.forward(x), y)

    def distillation_loss(self, batch, teacher_logits, interpolation=0.5):
        x, y = batch
        logits = self.forward(x)
        soft = nn.functional.kl_div(logits.log_softmax(-1), teacher_logits.softmax(-1), reduction="batchmean")
        return interpolation * soft + (1 - interpolation) * self.criterion(logits, y)


class ModelTrainer:
    def __init__(self, model, loader, lr=0.05):
        self.model = model
        self.loader = loader
        self.lr = lr

    def train(self, epochs, use_amp=False):
        if use_amp:
            if sys.version_info < (3, 0):
                raise RuntimeError("Apex currently only supports Python 3. Aborting.")
            if amp is None:
                raise RuntimeError("Failed to import apex. Please install apex to enable mixed-precision training.")
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9)
        if use_amp:
            self.model, optimizer = amp.initialize(self.model, optimizer, opt_level="O1")
        step = 0
        for epoch in range(epochs):
            for batch in self.loader:
                loss = self.model.forward_loss(batch)
                optimizer.zero_grad()
                if use_amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
                step += 1
                if step % 20 == 0:
                    print(f"step {step} loss {loss.item():.4f}")
