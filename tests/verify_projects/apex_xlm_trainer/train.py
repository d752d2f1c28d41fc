#!/usr/bin/env python
"""Written for ampmigrate's tests (no repository reduced): the layout of facebookresearch's XLM
trainer and its descendants. The networks and their optimizers live in dicts; `init_amp()` hands
apex lists built from them (`opt_level="O%i" % params.amp`, known at run time) and rebuilds the
dicts; `optimize(loss)` scales one loss for all the optimizers, accumulates with
`delay_unscale=True` between steps, clips `amp.master_params` per optimizer in a loop over the
names and steps them in a loop; the forward passes are in `enc_dec_step()`, which calls it.
A toy sequence labeller on synthetic token ids, CPU-sized.

    python train.py --amp 1 --accumulate_gradients 2
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_

import apex


class Encoder(nn.Module):
    def __init__(self, vocab=120, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)

    def forward(self, tokens):
        return torch.tanh(self.mix(self.embed(tokens)))


class Decoder(nn.Module):
    def __init__(self, dim=32, labels=7):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, labels)

    def forward(self, states):
        return self.out(torch.relu(self.hidden(states)))


class Trainer:
    def __init__(self, modules, params):
        self.modules = modules
        self.params = params
        self.n_iter = 0
        self.optimizers = {
            name: torch.optim.SGD(module.parameters(), lr=params.lr, momentum=0.9) for name, module in modules.items()
        }
        if params.amp >= 0:
            self.init_amp()

    def init_amp(self):
        params = self.params
        mod_names = sorted(self.modules.keys())
        opt_names = sorted(self.optimizers.keys())
        modules, optimizers = apex.amp.initialize(
            [self.modules[k] for k in mod_names],
            [self.optimizers[k] for k in opt_names],
            opt_level=("O%i" % params.amp),
        )
        self.modules = {k: module for k, module in zip(mod_names, modules)}
        self.optimizers = {k: optimizer for k, optimizer in zip(opt_names, optimizers)}

    def optimize(self, loss):
        params = self.params
        names = self.optimizers.keys()
        optimizers = [self.optimizers[k] for k in names]
        if params.amp == -1:
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
        else:
            if self.n_iter % params.accumulate_gradients == 0:
                with apex.amp.scale_loss(loss, optimizers) as scaled_loss:
                    scaled_loss.backward()
                if params.clip_grad_norm > 0:
                    for name in names:
                        clip_grad_norm_(apex.amp.master_params(self.optimizers[name]), params.clip_grad_norm)
                for optimizer in optimizers:
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                with apex.amp.scale_loss(loss, optimizers, delay_unscale=True) as scaled_loss:
                    scaled_loss.backward()
        self.n_iter += 1

    def enc_dec_step(self, tokens, labels):
        encoder, decoder = self.modules["encoder"], self.modules["decoder"]
        encoder.train()
        decoder.train()
        states = encoder(tokens)
        logits = decoder(states)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        self.optimize(loss)
        return loss.item()


def make_batches(count, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, 120, (batch_size, 10), generator=gen)
        labels = tokens % 7
        batches.append((tokens, labels))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", type=int, default=1)
    parser.add_argument("--accumulate_gradients", type=int, default=2)
    parser.add_argument("--clip_grad_norm", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    params = parser.parse_args()

    torch.manual_seed(0)
    modules = {"encoder": Encoder().to(params.device), "decoder": Decoder().to(params.device)}
    trainer = Trainer(modules, params)
    batches = make_batches(20, 16)
    for epoch in range(params.epochs):
        losses = [trainer.enc_dec_step(tokens.to(params.device), labels.to(params.device)) for tokens, labels in batches]
        print(f"epoch {epoch} loss {sum(losses) / len(losses):.4f}")


if __name__ == "__main__":
    main()
