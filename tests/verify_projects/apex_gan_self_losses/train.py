"""A CPU-sized training script written for ampmigrate's tests, after DG-Net's trainer
(NVlabs/DG-Net and its forks): a trainer module holds a generator and a discriminator, each set up
with its own `amp.initialize`, and keeps every loss on itself (`self.loss_gen_total = ...`) in
`gen_update` and `dis_update`, which scale them with apex under `if self.fp16:`. The data are
synthetic: the generator learns to map noise to a shifted Gaussian.

    python train.py --fp16
"""

import argparse

import torch
import torch.nn as nn

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--iterations", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def calc_gen_loss(self, fake):
        return ((self.forward(fake) - 1) ** 2).mean()  # LSGAN

    def calc_dis_loss(self, fake, real):
        return (self.forward(fake) ** 2).mean() + ((self.forward(real) - 1) ** 2).mean()


class Trainer(nn.Module):
    def __init__(self, fp16):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
        self.dis = Discriminator().to(device)
        self.gen_opt = torch.optim.Adam(self.gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.dis_opt = torch.optim.Adam(self.dis.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.fp16 = fp16
        if fp16:
            self.gen, self.gen_opt = amp.initialize(self.gen, self.gen_opt, opt_level="O1")
            self.dis, self.dis_opt = amp.initialize(self.dis, self.dis_opt, opt_level="O1")

    def gen_update(self, noise, real, weights):
        self.gen_opt.zero_grad()
        fake = self.gen(noise)
        self.loss_gen_adv = self.dis.calc_gen_loss(fake)
        self.loss_gen_moment = (fake.mean(0) - real.mean(0)).abs().mean()
        self.loss_gen_total = weights["gan"] * self.loss_gen_adv + weights["moment"] * self.loss_gen_moment
        if self.fp16:
            with amp.scale_loss(self.loss_gen_total, self.gen_opt) as scaled_loss:
                scaled_loss.backward()
        else:
            self.loss_gen_total.backward()
        self.gen_opt.step()

    def dis_update(self, noise, real):
        self.dis_opt.zero_grad()
        fake = self.gen(noise).detach()
        self.loss_dis_total = self.dis.calc_dis_loss(fake, real)
        if self.fp16:
            with amp.scale_loss(self.loss_dis_total, self.dis_opt) as scaled_loss:
                scaled_loss.backward()
        else:
            self.loss_dis_total.backward()
        self.dis_opt.step()


def main():
    trainer = Trainer(args.fp16)
    weights = {"gan": 1.0, "moment": 2.0}
    for iteration in range(args.iterations):
        noise = torch.randn(64, 8, device=device)
        real = torch.randn(64, 8, device=device) * 0.5 + 1.0
        trainer.dis_update(noise, real)
        trainer.gen_update(noise, real, weights)
        if iteration % 10 == 0:
            print(f"iteration {iteration} gen {trainer.loss_gen_total.item():.4f} dis {trainer.loss_dis_total.item():.4f}")
    torch.save(trainer.gen.state_dict(), "gen.pt")


if __name__ == "__main__":
    main()
