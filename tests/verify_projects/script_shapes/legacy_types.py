"""An old GAN script: legacy CUDA tensor types, `.type(torch.cuda.HalfTensor)`, fp16 autocast."""

import numpy as np
import torch
from torch import nn

cuda = torch.cuda.is_available()
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


def main():
    torch.manual_seed(0)
    np.random.seed(0)
    generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    discriminator = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    if cuda:
        generator.cuda()
        discriminator.cuda()
    adversarial = nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler()
    for step in range(10_000):
        real = Tensor(np.random.normal(2.0, 0.5, (32, 2)))
        assert isinstance(real, torch.cuda.FloatTensor if cuda else torch.FloatTensor)
        real = real.type(torch.cuda.HalfTensor).type(Tensor)  # a round trip through the legacy types
        real = real.type("torch.cuda.FloatTensor")  # and their names
        valid = Tensor(32, 1).fill_(1.0)
        fake_label = Tensor(32, 1).fill_(0.0)
        z = Tensor(np.random.normal(0, 1, (32, 4)))

        opt_d.zero_grad()
        with torch.cuda.amp.autocast():
            fake = generator(z)
            loss_d = adversarial(discriminator(real), valid) + adversarial(discriminator(fake.detach()), fake_label)
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)

        opt_g.zero_grad()
        with torch.cuda.amp.autocast():
            loss_g = adversarial(discriminator(fake), valid)
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()


if __name__ == "__main__":
    main()
