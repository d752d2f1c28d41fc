import torch
from torch import nn

try:
    from apex import amp
except ImportError:
    amp = None


class Regressor(nn.Module):
    """Owns its optimizer and runs its own training step (`update()`), as SeqRegNet's and PLATO's
    models do."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
        self.optimizer = torch.optim.SGD(self.parameters(), lr=config["lr"], momentum=0.9)

    def forward(self, x):
        return self.body(x)

    def update(self, x, y):
        self.optimizer.zero_grad()
        prediction = self.forward(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        if self.config["fp16"]:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self.optimizer.step()
        return loss.item()


MODELS = {"regressor": Regressor}
