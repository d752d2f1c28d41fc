"""A Hugging Face `Trainer.train()` script with `fp16=True` (a tiny model, no downloads)."""

import torch
from torch import nn
from transformers import Trainer, TrainingArguments, set_seed


class TinyRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x)
        loss = nn.functional.mse_loss(prediction, labels) if labels is not None else None
        return {"loss": loss, "logits": prediction}


def main():
    set_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=gen)
    y = x[:, :3].sum(dim=1, keepdim=True) - x[:, 3:4]
    data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = TrainingArguments(
        output_dir="hf_out", per_device_train_batch_size=32, learning_rate=3e-3, num_train_epochs=100,
        fp16=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    Trainer(model=TinyRegressor(), args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
