"""A CPU-sized training script written for ampmigrate's tests, after a shape common in Kaggle code
built on pytorch-ignite (kaggle-kuzushiji-2019's classifier and the like): `main()` sets apex up
under `if fp16:`, and a trainer factory returns an engine whose update function, a closure,
scales the loss with apex and steps every `--accumulation-steps` iterations. The engine here is a
few lines of ignite's `Engine` (no ignite needed). The data are synthetic: a 4-class
classification on 16 features.

    python train.py --fp16 --accumulation-steps 2
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Engine:
    """ignite's Engine, reduced: runs `process(engine, batch)` over the data, counting iterations."""

    def __init__(self, process):
        self.process = process
        self.iteration = 0

    def run(self, loader, max_epochs):
        for _ in range(max_epochs):
            for batch in loader:
                self.iteration += 1
                output = self.process(self, batch)
                if self.iteration % 20 == 0:
                    print(f"iteration {self.iteration} loss {output:.4f}")


def create_supervised_trainer(model, optimizer, loss_fn, device=None, accumulation_steps=1, fp16=False):
    def update_fn(engine, batch):
        model.train()
        x, y = (t.to(device) for t in batch)
        y_pred = model(x)
        loss = loss_fn(y_pred, y)
        if fp16:
            from apex import amp
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        if engine.iteration % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()

        return loss.item()

    return Engine(update_fn)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--opt-level", default="O1")
    parser.add_argument("--accumulation-steps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = torch.randn(512, 16)
    classes = features[:, :4].argmax(dim=1)
    loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    fp16 = args.fp16
    if fp16:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

    trainer = create_supervised_trainer(
        model, optimizer, nn.CrossEntropyLoss(), device=device,
        accumulation_steps=args.accumulation_steps, fp16=fp16,
    )
    trainer.run(loader, max_epochs=args.epochs)
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
