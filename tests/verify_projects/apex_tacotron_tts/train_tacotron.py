"""A CPU-sized reduction, written for ampmigrate's tests, of coqui-ai/TTS TTS/bin/train_tacotron.py
as it was before TTS moved to torch.amp (the parent of commit a7aefd5c): `main()` imports apex only
`if c.apex_amp_level == "O1":` (else `amp = None`), initializes with
`opt_level=c.apex_amp_level`, and passes the `amp` module into `train(..., amp)`, which scales the
loss `if amp is not None:`, hands `amp.master_params(optimizer)` to `check_update` (training.py)
`if amp:`, backpropagates a separate stopnet loss unscaled, and saves `amp.state_dict() if amp else
None` with its checkpoints. The model is a tiny decoder/postnet/stopnet on synthetic mel frames.

    python train_tacotron.py --config_path config.json
"""

import argparse
import json
import os
import time

import torch
from torch import nn

from training import adam_weight_decay, check_update, save_best_model, save_checkpoint, set_weight_decay

use_cuda = torch.cuda.is_available()


def load_config(config_path):
    with open(config_path) as f:
        return argparse.Namespace(**json.load(f))


def setup_loader(r):
    gen = torch.Generator().manual_seed(11)
    table = torch.randn(c.num_chars, c.audio["num_mels"], generator=gen)
    text = torch.randint(1, c.num_chars, (480, 16), generator=gen)
    mel = table[text] + 0.1 * torch.randn(480, 16, c.audio["num_mels"], generator=gen)
    stop = torch.zeros(480, 16)
    stop[:, -r:] = 1.0
    dataset = torch.utils.data.TensorDataset(text, mel, stop)
    return torch.utils.data.DataLoader(dataset, batch_size=c.batch_size, shuffle=True, drop_last=True)


class Decoder(nn.Module):
    def __init__(self, r):
        super().__init__()
        self.r = r
        self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, c.audio["num_mels"]))
        self.stopnet = nn.Sequential(nn.Linear(c.audio["num_mels"] + 32, 1))

    def forward(self, memory):
        decoder_output = self.net(memory)
        stopnet_input = torch.cat([decoder_output, memory], -1)
        if c.separate_stopnet:
            stop_tokens = self.stopnet(stopnet_input.detach())
        else:
            stop_tokens = self.stopnet(stopnet_input)
        return decoder_output, stop_tokens.squeeze(-1)


class TinyTacotron(nn.Module):
    def __init__(self, num_chars, r):
        super().__init__()
        self.embedding = nn.Embedding(num_chars, 32)
        self.decoder = Decoder(r)
        self.postnet = nn.Sequential(nn.Linear(c.audio["num_mels"], 32), nn.Tanh(), nn.Linear(32, c.audio["num_mels"]))

    def forward(self, text):
        memory = self.embedding(text)
        decoder_output, stop_tokens = self.decoder(memory)
        postnet_output = decoder_output + self.postnet(decoder_output)
        alignments = torch.softmax(memory @ memory.transpose(1, 2), -1)
        return decoder_output, postnet_output, alignments, stop_tokens


class TacotronLoss(nn.Module):
    def __init__(self, stopnet_pos_weight=10.0):
        super().__init__()
        self.criterion = nn.L1Loss()
        self.criterion_st = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(stopnet_pos_weight))

    def forward(self, postnet_output, decoder_output, mel_input, stopnet_output, stopnet_target):
        return_dict = {}
        decoder_loss = self.criterion(decoder_output, mel_input)
        postnet_loss = self.criterion(postnet_output, mel_input)
        loss = decoder_loss + postnet_loss
        return_dict['decoder_loss'] = decoder_loss
        return_dict['postnet_loss'] = postnet_loss
        stop_loss = self.criterion_st(stopnet_output, stopnet_target) if c.stopnet else torch.zeros(1)
        if not c.separate_stopnet and c.stopnet:
            loss += stop_loss
        return_dict['stopnet_loss'] = stop_loss
        return_dict['loss'] = loss
        return return_dict


def train(model, criterion, optimizer, optimizer_st, scheduler,
          global_step, epoch, amp):
    data_loader = setup_loader(model.decoder.r)
    model.train()
    epoch_time = 0
    avg_postnet_loss = 0.0
    for num_iter, data in enumerate(data_loader):
        start_time = time.time()
        text_input, mel_input, stop_targets = data
        if use_cuda:
            text_input = text_input.cuda(non_blocking=True)
            mel_input = mel_input.cuda(non_blocking=True)
            stop_targets = stop_targets.cuda(non_blocking=True)

        global_step += 1

        # setup lr
        if c.noam_schedule:
            scheduler.step()
        optimizer.zero_grad()
        if optimizer_st:
            optimizer_st.zero_grad()

        # forward pass model
        decoder_output, postnet_output, alignments, stop_tokens = model(text_input)

        # compute loss
        loss_dict = criterion(postnet_output, decoder_output, mel_input, stop_tokens, stop_targets)

        # backward pass
        if amp is not None:
            with amp.scale_loss(loss_dict['loss'], optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss_dict['loss'].backward()

        optimizer, current_lr = adam_weight_decay(optimizer)
        if amp:
            amp_opt_params = amp.master_params(optimizer)
        else:
            amp_opt_params = None
        grad_norm, _ = check_update(model, c.grad_clip, ignore_stopnet=True, amp_opt_params=amp_opt_params)
        optimizer.step()

        # backpass and check the grad norm for stop loss
        if c.separate_stopnet:
            loss_dict['stopnet_loss'].backward()
            optimizer_st, _ = adam_weight_decay(optimizer_st)
            if amp:
                amp_opt_params = amp.master_params(optimizer)
            else:
                amp_opt_params = None
            grad_norm_st, _ = check_update(model.decoder.stopnet, 1.0, amp_opt_params=amp_opt_params)
            optimizer_st.step()
        else:
            grad_norm_st = 0

        step_time = time.time() - start_time
        epoch_time += step_time
        avg_postnet_loss += loss_dict['postnet_loss'].item()

        if global_step % c.save_step == 0:
            print("step {} loss {:.5f} grad_norm {:.5f} grad_norm_st {:.5f} lr {:.6f}".format(
                global_step, loss_dict['loss'].item(), float(grad_norm), float(grad_norm_st), current_lr))
            save_checkpoint(model, optimizer, global_step, epoch, model.decoder.r, OUT_PATH,
                            optimizer_st=optimizer_st,
                            model_loss=loss_dict['postnet_loss'],
                            amp_state_dict=amp.state_dict() if amp else None)

    return {'avg_postnet_loss': avg_postnet_loss / (num_iter + 1)}, global_step


def main(args):  # pylint: disable=redefined-outer-name
    model = TinyTacotron(c.num_chars, c.r)

    params = set_weight_decay(model, c.wd)
    optimizer = torch.optim.RAdam(params, lr=c.lr, weight_decay=0)
    if c.stopnet and c.separate_stopnet:
        optimizer_st = torch.optim.RAdam(model.decoder.stopnet.parameters(), lr=c.lr, weight_decay=0)
    else:
        optimizer_st = None

    if c.apex_amp_level == "O1":
        # pylint: disable=import-outside-toplevel
        from apex import amp
        model.cuda()
        model, optimizer = amp.initialize(model, optimizer, opt_level=c.apex_amp_level)
    else:
        amp = None

    # setup criterion
    criterion = TacotronLoss(stopnet_pos_weight=10.0)

    if use_cuda:
        model.cuda()
        criterion.cuda()

    scheduler = None
    best_loss = float('inf')
    global_step = 0
    for epoch in range(0, c.epochs):
        train_avg_loss_dict, global_step = train(model, criterion, optimizer,
                                                 optimizer_st, scheduler,
                                                 global_step, epoch, amp)
        target_loss = train_avg_loss_dict['avg_postnet_loss']
        best_loss = save_best_model(target_loss, best_loss, model, optimizer, global_step, epoch, c.r,
                                    OUT_PATH, amp_state_dict=amp.state_dict() if amp else None)


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--config_path', type=str, default='config.json', help='Path to config file for training.')
    parser.add_argument('--output_path', type=str, default='tts_out', help='Folder for checkpoints.')
    args = parser.parse_args()

    c = load_config(args.config_path)
    OUT_PATH = args.output_path
    os.makedirs(OUT_PATH, exist_ok=True)
    torch.manual_seed(54321)
    main(args)
