"""A CPU-sized training script written for ampmigrate's tests, in the layout of the widely copied
CycleGAN/pix2pix template (junyanz/pytorch-CycleGAN-and-pix2pix and its apex ports): a model class
whose `forward()` stores the generated samples on the instance, whose `backward_D()` and
`backward_G()` store the losses, and whose `optimize_parameters()` calls them before scaling
`self.loss_D` and `self.loss_G` with apex (both networks and optimizers given to one
`amp.initialize` with `num_losses=2`). The data are synthetic: the generator learns to map one
Gaussian onto a shifted one, helped by an L1 term.

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


class Pix2PixModel:
    def __init__(self, fp16, lambda_l1=5.0):
        self.netG = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
        self.netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)).to(device)
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.criterionL1 = nn.L1Loss()
        self.lambda_l1 = lambda_l1
        if fp16:
            [self.netG, self.netD], [self.optimizer_G, self.optimizer_D] = amp.initialize(
                [self.netG, self.netD], [self.optimizer_G, self.optimizer_D], opt_level="O1", num_losses=2
            )

    def set_input(self, real_A, real_B):
        self.real_A = real_A
        self.real_B = real_B

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    def backward_D(self):
        pred_fake = self.netD(torch.cat((self.real_A, self.fake_B.detach()), 1))
        pred_real = self.netD(torch.cat((self.real_A, self.real_B), 1))
        self.loss_D = 0.5 * ((pred_fake ** 2).mean() + ((pred_real - 1) ** 2).mean())

    def backward_G(self):
        pred_fake = self.netD(torch.cat((self.real_A, self.fake_B), 1))
        self.loss_G_GAN = ((pred_fake - 1) ** 2).mean()
        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.lambda_l1
        self.loss_G = self.loss_G_GAN + self.loss_G_L1

    def optimize_parameters(self):
        self.forward()
        self.optimizer_D.zero_grad()
        self.backward_D()
        with amp.scale_loss(self.loss_D, self.optimizer_D, loss_id=0) as scaled_loss:
            scaled_loss.backward()
        self.optimizer_D.step()
        self.optimizer_G.zero_grad()
        self.backward_G()
        with amp.scale_loss(self.loss_G, self.optimizer_G, loss_id=1) as scaled_loss:
            scaled_loss.backward()
        self.optimizer_G.step()


def main():
    model = Pix2PixModel(args.fp16)
    for iteration in range(args.iterations):
        real_A = torch.randn(64, 8, device=device)
        real_B = real_A * 0.5 + 1.0
        model.set_input(real_A, real_B)
        model.optimize_parameters()
        if iteration % 10 == 0:
            print(f"iteration {iteration} G {model.loss_G.item():.4f} D {model.loss_D.item():.4f}")
    torch.save(model.netG.state_dict(), "netG.pt")


if __name__ == "__main__":
    main()
