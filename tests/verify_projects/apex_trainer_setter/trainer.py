"""The trainer of a CPU-sized project written for ampmigrate's tests, in the shape of a training
library's trainer: mixed precision is switched on by a property setter (`trainer.mixed_precision =
True`, which sets apex up), `apply_model_and_loss(..., backward=True)` scales the loss under
`if backward:`, and `train_for()` steps the optimizer after calling it; `validate_for()` calls it
with `backward=False`.
"""

import torch

try:
    from apex import amp
except ImportError:
    amp = None


class Trainer:
    def __init__(self, model, optimizer, criterion):
        self.model = model
        self.optimizer = optimizer
        self.criterion = criterion
        self._mixed_precision = False

    @property
    def mixed_precision(self):
        return self._mixed_precision

    @mixed_precision.setter
    def mixed_precision(self, mp):
        if mp:
            assert amp is not None, "mixed precision needs apex"
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1", verbosity=0)
        self._mixed_precision = mp

    def apply_model_and_loss(self, inputs, target, backward=True):
        prediction = self.model(inputs)
        loss = self.criterion(prediction, target)
        if backward:
            if self.mixed_precision:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
        return prediction, loss

    def train_for(self, loader, epoch):
        self.model.train()
        for step, (inputs, target) in enumerate(loader):
            self.optimizer.zero_grad()
            prediction, loss = self.apply_model_and_loss(inputs, target, backward=True)
            self.optimizer.step()
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")

    def validate_for(self, loader):
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for inputs, target in loader:
                prediction, loss = self.apply_model_and_loss(inputs, target, backward=False)
                total += loss.item()
        return total / len(loader)
