"""A CPU-sized reduction, written for ampmigrate's tests, of the training loop of NVIDIA/mellotron
train.py (the same loop as NVIDIA/tacotron2 train.py): apex imported inside `if hparams.fp16_run:`,
`amp.initialize(..., opt_level='O2')`, the loss scaled only when fp16_run, the gradient norm clipped
over `amp.master_params(optimizer)` and an overflow read as `math.isnan(grad_norm)`, a plain
`optimizer.step()` (apex skips it on overflow), and a checkpoint without amp state.
The model is a tiny mel-frame regressor with a gate output, trained on synthetic frames.
"""

import math
import os
import time

import torch
from torch import nn


class HParams:
    fp16_run = True
    seed = 1234
    epochs = 50
    batch_size = 16
    learning_rate = 1e-3
    learning_rate_min = 1e-5
    learning_rate_anneal = 50000
    weight_decay = 1e-6
    grad_clip_thresh = 1.0
    iters_per_checkpoint = 25
    n_mel_channels = 8
    n_symbols = 12


class Tacotron2Loss(nn.Module):
    def forward(self, model_output, targets):
        mel_target, gate_target = targets
        mel_out, gate_out = model_output
        mel_loss = nn.MSELoss()(mel_out, mel_target)
        gate_loss = nn.BCEWithLogitsLoss()(gate_out, gate_target)
        return mel_loss + gate_loss


class TinyTacotron(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        self.embedding = nn.Embedding(hparams.n_symbols, 32)
        self.decoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, hparams.n_mel_channels))
        self.gate = nn.Linear(32, 1)

    def parse_batch(self, batch):
        text, mel, gate = batch
        return text.cuda(), (mel.cuda(), gate.cuda())

    def forward(self, text):
        hidden = self.embedding(text)
        return self.decoder(hidden), self.gate(hidden).squeeze(-1)


def load_model(hparams):
    return TinyTacotron(hparams).cuda()


def prepare_dataloaders(hparams):
    gen = torch.Generator().manual_seed(7)
    table = torch.randn(hparams.n_symbols, hparams.n_mel_channels, generator=gen)
    text = torch.randint(0, hparams.n_symbols, (512, 20), generator=gen)
    mel = table[text] + 0.05 * torch.randn(512, 20, hparams.n_mel_channels, generator=gen)
    gate = (text == 0).float()
    dataset = torch.utils.data.TensorDataset(text, mel, gate)
    return torch.utils.data.DataLoader(dataset, batch_size=hparams.batch_size, shuffle=True, drop_last=True)


def save_checkpoint(model, optimizer, learning_rate, iteration, filepath):
    print("Saving model and optimizer state at iteration {} to {}".format(iteration, filepath))
    torch.save({'iteration': iteration,
                'state_dict': model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'learning_rate': learning_rate}, filepath)


def train(output_directory, hparams):
    torch.manual_seed(hparams.seed)
    torch.cuda.manual_seed(hparams.seed)

    model = load_model(hparams)
    learning_rate = hparams.learning_rate
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate,
                                 weight_decay=hparams.weight_decay)

    if hparams.fp16_run:
        from apex import amp
        model, optimizer = amp.initialize(
            model, optimizer, opt_level='O2')

    criterion = Tacotron2Loss()
    train_loader = prepare_dataloaders(hparams)
    os.makedirs(output_directory, exist_ok=True)

    iteration = 0
    model.train()
    is_overflow = False
    for epoch in range(hparams.epochs):
        for i, batch in enumerate(train_loader):
            start = time.perf_counter()
            if iteration > 0 and iteration % hparams.learning_rate_anneal == 0:
                learning_rate = max(hparams.learning_rate_min, learning_rate * 0.5)
                for param_group in optimizer.param_groups:
                    param_group['lr'] = learning_rate

            model.zero_grad()
            x, y = model.parse_batch(batch)
            y_pred = model(x)

            loss = criterion(y_pred, y)
            reduced_loss = loss.item()

            if hparams.fp16_run:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()

            if hparams.fp16_run:
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    amp.master_params(optimizer), hparams.grad_clip_thresh)
                is_overflow = math.isnan(grad_norm)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    model.parameters(), hparams.grad_clip_thresh)

            optimizer.step()

            if not is_overflow:
                duration = time.perf_counter() - start
                print("Train loss {} {:.6f} Grad Norm {:.6f} {:.2f}s/it".format(
                    iteration, reduced_loss, grad_norm, duration))

            if not is_overflow and (iteration % hparams.iters_per_checkpoint == 0):
                checkpoint_path = os.path.join(output_directory, "checkpoint_{}".format(iteration))
                save_checkpoint(model, optimizer, learning_rate, iteration, checkpoint_path)

            iteration += 1


if __name__ == '__main__':
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = False
    hparams = HParams()
    print("FP16 Run:", hparams.fp16_run)
    train("outdir", hparams)
