"""A CPU-sized reduction, written for ampmigrate's tests, of the LM training of ESPnet1
(espnet/lm/pytorch_backend/lm.py): a chainer-style updater class (`BPTTUpdater`, here over a small
stand-in for chainer's `StandardUpdater`) whose `update_core()` accumulates `accum_grad`
micro-batches in a counted loop, imports apex locally and scales the loss only when `use_apex`,
then clips and steps after the loop; `train()` sets apex up under
`if args.train_dtype in ("O0", "O1", "O2", "O3")` with `opt_level=args.train_dtype`, behind a
try/except import that logs and re-raises. The model is a tiny next-token predictor on synthetic
sequences.
"""

import argparse
import logging

import torch
from torch import nn


class StandardUpdater(object):
    """What the updater needs of chainer's: named iterators and optimizers, an iteration count."""

    def __init__(self, iterator, optimizer):
        self._iterators = {"main": iterator}
        self._optimizers = {"main": optimizer}
        self.iteration = 0

    def get_iterator(self, name):
        return self._iterators[name]

    def get_optimizer(self, name):
        return self._optimizers[name]

    def update(self):
        self.update_core()
        self.iteration += 1


class TinyLM(nn.Module):
    def __init__(self, n_vocab, n_units):
        super().__init__()
        self.embed = nn.Embedding(n_vocab, n_units)
        self.hidden = nn.Sequential(nn.Linear(n_units, n_units), nn.Tanh())
        self.output = nn.Linear(n_units, n_vocab)

    def forward(self, x, t):
        logits = self.output(self.hidden(self.embed(x)))
        nll = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), t.view(-1), reduction="none")
        count = torch.tensor(t.numel())
        return nll.mean(), nll, count


class BPTTUpdater(StandardUpdater):
    """An updater for a pytorch LM."""

    def __init__(self, train_iter, model, optimizer, device, gradclip=None, use_apex=False, accum_grad=1):
        super(BPTTUpdater, self).__init__(train_iter, optimizer)
        self.model = model
        self.device = device
        self.gradclip = gradclip
        self.use_apex = use_apex
        self.accum_grad = accum_grad
        self.losses = []

    def update_core(self):
        train_iter = self.get_iterator("main")
        optimizer = self.get_optimizer("main")
        self.model.zero_grad()
        accum = {"loss": 0.0, "count": 0}
        for _ in range(self.accum_grad):
            x, t = next(train_iter)
            x, t = x.to(self.device), t.to(self.device)
            loss, nll, count = self.model(x, t)

            # backward
            loss = loss.mean() / self.accum_grad
            if self.use_apex:
                from apex import amp
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()  # Backprop
            accum["loss"] += float(loss)
            accum["count"] += int(count.sum())

        self.losses.append(accum["loss"])
        print("iteration {} loss {:.6f}".format(self.iteration, accum["loss"]))
        if self.gradclip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.gradclip)
        optimizer.step()  # Update the parameters


def batches(n_vocab, batch_size, length, seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(0, n_vocab, (batch_size, length), generator=gen)
        yield x, (x * 3 + 1) % n_vocab


def train(args):
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    model = TinyLM(args.n_vocab, args.units).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    # setup apex.amp
    if args.train_dtype in ("O0", "O1", "O2", "O3"):
        try:
            from apex import amp
        except ImportError as e:
            logging.error(f"You need to install apex for --train-dtype {args.train_dtype}. "
                          "See https://github.com/NVIDIA/apex#linux")
            raise e
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.train_dtype)
        use_apex = True
    else:
        use_apex = False

    updater = BPTTUpdater(batches(args.n_vocab, args.batch_size, 12, args.seed), model, optimizer, device,
                          gradclip=args.gradclip, use_apex=use_apex, accum_grad=args.accum_grad)
    for _ in range(args.iterations):
        updater.update()
    return updater.losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-dtype", default="float32", choices=["float16", "float32", "float64", "O0", "O1", "O2", "O3"])
    parser.add_argument("--accum-grad", type=int, default=2)
    parser.add_argument("--gradclip", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--n-vocab", type=int, default=32)
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=1)
    train(parser.parse_args())
