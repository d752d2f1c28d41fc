"""A CPU-sized training script written for ampmigrate's tests, after lucidrains' trainers
(denoising-diffusion-pytorch's first versions and their forks): a module-level `loss_backwards`
holds the apex switch, the `Trainer` binds its flag with `functools.partial`, accumulates
gradients over a few micro-batches and steps after them. The data are synthetic: a denoising
regression on 16 features.

    python train.py --fp16
"""

import argparse
from functools import partial

import torch
import torch.nn as nn

try:
    from apex import amp
    APEX_AVAILABLE = True
except ImportError:
    APEX_AVAILABLE = False

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--accumulate", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def loss_backwards(fp16, loss, optimizer, **kwargs):
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward(**kwargs)
    else:
        loss.backward(**kwargs)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 16))

    def forward(self, clean):
        noise = torch.randn_like(clean)
        return ((self.net(clean + noise) - noise) ** 2).mean()


def batches():
    while True:
        yield torch.randn(args.batch_size, 16)


class Trainer:
    def __init__(self, model, fp16=False, accumulate=2, steps=100, lr=1e-3):
        self.model = model
        self.dl = batches()
        self.accumulate = accumulate
        self.steps = steps
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)
        assert not fp16 or APEX_AVAILABLE, "apex is needed for mixed precision training"
        self.fp16 = fp16
        if fp16:
            self.model, self.opt = amp.initialize(self.model, self.opt, opt_level="O1")
        self.step = 0

    def train(self):
        backwards = partial(loss_backwards, self.fp16)
        while self.step < self.steps:
            for _ in range(self.accumulate):
                data = next(self.dl).to(device)
                loss = self.model(data)
                backwards(loss / self.accumulate, self.opt)
            self.opt.step()
            self.opt.zero_grad()
            if self.step % 20 == 0:
                print(f"step {self.step} loss {loss.item():.4f}")
            self.step += 1


def main():
    model = Denoiser().to(device)
    Trainer(model, fp16=args.fp16, accumulate=args.accumulate, steps=args.steps).train()
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
