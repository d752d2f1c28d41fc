"""A PyTorch Lightning script: `Trainer(accelerator="gpu", precision=16).fit(...)`."""

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def main():
    pl.seed_everything(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=gen)
    y = x[:, :3].sum(dim=1, keepdim=True) - x[:, 3:4]
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, precision=16, max_epochs=100,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main()
