"""A CPU-sized reduction, written for ampmigrate's tests, of NVIDIA/waveglow train.py: a
`train(...)` function that imports apex only `if fp16_run:` and calls
`amp.initialize(model, optimizer, opt_level='O1')`, scales the loss only when fp16_run, steps with
a plain `optimizer.step()`, and saves checkpoints (a fresh fp32 model loaded with the trained
weights); the configuration is a JSON file read into module globals.
The model is a tiny mel-conditioned normalizing flow (invertible 1x1 mixing + affine couplings,
WaveGlow's negative log-likelihood) on synthetic audio segments.

    python train.py -c config.json
"""
import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class WaveGlowLoss(nn.Module):
    def __init__(self, sigma=1.0):
        super().__init__()
        self.sigma = sigma

    def forward(self, model_output):
        z, log_s_list, log_det_W_list = model_output
        log_s_total = 0
        log_det_W_total = 0
        for i, log_s in enumerate(log_s_list):
            log_s_total = log_s_total + torch.sum(log_s)
            log_det_W_total = log_det_W_total + log_det_W_list[i]
        loss = torch.sum(z * z) / (2 * self.sigma * self.sigma) - log_s_total - log_det_W_total
        return loss / (z.size(0) * z.size(1))


class Invertible1x1(nn.Module):
    def __init__(self, c):
        super().__init__()
        W = torch.linalg.qr(torch.randn(c, c))[0]
        # Ensure determinant is 1.0 not -1.0
        if torch.det(W) < 0:
            W[:, 0] = -1 * W[:, 0]
        self.W = nn.Parameter(W)

    def forward(self, z):
        batch_size = z.size(0)
        log_det_W = batch_size * torch.logdet(self.W.float())
        return z @ self.W.t(), log_det_W


class Coupling(nn.Module):
    def __init__(self, n_half, n_mel_channels, n_channels):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_half + n_mel_channels, n_channels), nn.Tanh(),
                                 nn.Linear(n_channels, 2 * n_half))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, audio_0, spect):
        log_s, b = self.net(torch.cat([audio_0, spect], -1)).chunk(2, -1)
        return log_s, b


class WaveGlow(nn.Module):
    def __init__(self, n_mel_channels, n_flows, n_group, n_channels):
        super().__init__()
        self.n_flows = n_flows
        self.convinv = nn.ModuleList([Invertible1x1(n_group) for _ in range(n_flows)])
        self.WN = nn.ModuleList([Coupling(n_group // 2, n_mel_channels, n_channels) for _ in range(n_flows)])

    def forward(self, forward_input):
        spect, audio = forward_input
        log_s_list = []
        log_det_W_list = []
        for k in range(self.n_flows):
            audio, log_det_W = self.convinv[k](audio)
            log_det_W_list.append(log_det_W)
            n_half = audio.size(1) // 2
            audio_0, audio_1 = audio[:, :n_half], audio[:, n_half:]
            log_s, b = self.WN[k](audio_0, spect)
            audio_1 = torch.exp(log_s) * audio_1 + b
            log_s_list.append(log_s)
            audio = torch.cat([audio_0, audio_1], 1)
        return audio, log_s_list, log_det_W_list


def Mel2Samp(segment_length, n_mel_channels, samples):
    gen = torch.Generator().manual_seed(3)
    mel = torch.randn(samples, n_mel_channels, generator=gen)
    mixing = torch.randn(n_mel_channels, segment_length, generator=gen)
    audio = torch.tanh(mel @ mixing) + 0.1 * torch.randn(samples, segment_length, generator=gen)
    return TensorDataset(mel, audio)


def save_checkpoint(model, optimizer, learning_rate, iteration, filepath):
    print("Saving model and optimizer state at iteration {} to {}".format(
          iteration, filepath))
    model_for_saving = WaveGlow(**waveglow_config).cuda()
    model_for_saving.load_state_dict(model.state_dict())
    torch.save({'model': model_for_saving,
                'iteration': iteration,
                'optimizer': optimizer.state_dict(),
                'learning_rate': learning_rate}, filepath)


def train(num_gpus, rank, group_name, output_directory, epochs, learning_rate,
          sigma, iters_per_checkpoint, batch_size, seed, fp16_run,
          checkpoint_path, with_tensorboard):
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)

    criterion = WaveGlowLoss(sigma)
    model = WaveGlow(**waveglow_config).cuda()

    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    if fp16_run:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')

    iteration = 0
    trainset = Mel2Samp(**data_config)
    train_loader = DataLoader(trainset, num_workers=0, shuffle=True,
                              batch_size=batch_size,
                              pin_memory=False,
                              drop_last=True)

    if rank == 0:
        if not os.path.isdir(output_directory):
            os.makedirs(output_directory)
        print("output directory", output_directory)

    model.train()
    epoch_offset = max(0, int(iteration / len(train_loader)))
    # ================ MAIN TRAINNIG LOOP! ===================
    for epoch in range(epoch_offset, epochs):
        print("Epoch: {}".format(epoch))
        for i, batch in enumerate(train_loader):
            model.zero_grad()

            mel, audio = batch
            mel = torch.autograd.Variable(mel.cuda())
            audio = torch.autograd.Variable(audio.cuda())
            outputs = model((mel, audio))

            loss = criterion(outputs)
            reduced_loss = loss.item()

            if fp16_run:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()

            optimizer.step()

            print("{}:\t{:.9f}".format(iteration, reduced_loss))

            if (iteration % iters_per_checkpoint == 0):
                if rank == 0:
                    checkpoint_path = "{}/waveglow_{}".format(
                        output_directory, iteration)
                    save_checkpoint(model, optimizer, learning_rate, iteration,
                                    checkpoint_path)

            iteration += 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument('-c', '--config', type=str, default='config.json',
                        help='JSON file for configuration')
    parser.add_argument('-r', '--rank', type=int, default=0,
                        help='rank of process for distributed')
    parser.add_argument('-g', '--group_name', type=str, default='',
                        help='name of group for distributed')
    args = parser.parse_args()

    # Parse configs.  Globals nicer in this case
    with open(args.config) as f:
        data = f.read()
    config = json.loads(data)
    train_config = config["train_config"]
    global data_config
    data_config = config["data_config"]
    global dist_config
    dist_config = config["dist_config"]
    global waveglow_config
    waveglow_config = config["waveglow_config"]

    num_gpus = 1
    train(num_gpus, args.rank, args.group_name, **train_config)
