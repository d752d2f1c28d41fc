"""A CPU-sized training script written for ampmigrate's tests, after dvl-tum's intra_batch and
GHOST trainers: a `Trainer` class runs a hyperparameter search, each iteration building a new
model and optimizer, setting apex up in `train()` (`global amp; from apex import amp` under the
config's `is_apex`, an int: YAML's `is_apex: 0`, `--is_apex 1`), then training in `execute()`,
which scales the loss. The data are synthetic: a 4-class classification on 16 features.

    python train.py --is_apex 1
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, config, device):
        self.config = config
        self.device = device
        self.losses = []

    def train(self):
        for i in range(self.config["search_iters"]):
            torch.manual_seed(i)
            lr = self.config["lr"] / (i + 1)
            self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU()).to(self.device)
            self.head = nn.Linear(64, 4).to(self.device)
            params = list(self.encoder.parameters()) + list(self.head.parameters())
            self.opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
            if self.config["is_apex"]:
                global amp
                from apex import amp
                [self.encoder, self.head], self.opt = amp.initialize([self.encoder, self.head], self.opt, opt_level="O1")
            self.execute()

    def forward_pass(self, x, y):
        return nn.functional.cross_entropy(self.head(self.encoder(x)), y)

    def execute(self):
        features = torch.randn(512, 16)
        classes = features[:, :4].argmax(dim=1)
        loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
        for epoch in range(self.config["epochs"]):
            for x, y in loader:
                x, y = x.to(self.device), y.to(self.device)
                self.opt.zero_grad()
                loss = self.forward_pass(x, y)
                if self.config["is_apex"]:
                    with amp.scale_loss(loss, self.opt) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                self.opt.step()
                self.losses.append(loss.item())
                if len(self.losses) % 20 == 0:
                    print(f"step {len(self.losses)} loss {loss.item():.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--is_apex", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = {"is_apex": args.is_apex, "search_iters": 2, "lr": 0.05, "epochs": args.epochs}
    Trainer(config, device).train()
