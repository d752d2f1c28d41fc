"""A CPU-sized UER-py-style pretraining script written for ampmigrate's tests (no repository
reduced): `worker()` builds the optimizer and scheduler, sets apex up under `if args.fp16:` with the
opt level read from the command line, and stores the module on the argument namespace
(`args.amp = amp`); the trainer class, picked from a dict by `--target`, reads it back as
`args.amp.scale_loss(...)` in `train()`, accumulates gradients and steps every
`--accumulation_steps` batches. A toy masked-token classifier on synthetic token ids.

    python train.py --fp16 --accumulation_steps 2
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--fp16_opt_level", choices=["O0", "O1", "O2", "O3"], default="O1")
parser.add_argument("--target", default="mlm")
parser.add_argument("--total_steps", type=int, default=40)
parser.add_argument("--accumulation_steps", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--learning_rate", type=float, default=2e-3)
parser.add_argument("--report_steps", type=int, default=10)

VOCAB, LENGTH = 50, 12
device = "cuda" if torch.cuda.is_available() else "cpu"


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.output = nn.Linear(32, VOCAB)

    def forward(self, src, tgt):
        hidden = self.layer(self.embedding(src))
        logits = self.output(hidden)
        return F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))


def batches(batch_size):
    generator = torch.Generator().manual_seed(1)
    while True:
        tgt = torch.randint(0, VOCAB, (batch_size, LENGTH), generator=generator)
        src = tgt.clone()
        src[:, ::3] = 0  # masked positions
        yield src, tgt


class Trainer:
    def __init__(self, args):
        self.current_step = 1
        self.total_steps = args.total_steps
        self.accumulation_steps = args.accumulation_steps
        self.report_steps = args.report_steps
        self.total_loss = 0.0

    def forward_propagation(self, batch, model):
        src, tgt = batch
        loss = model(src, tgt)
        self.total_loss += loss.item()
        return loss

    def train(self, args, loader, model, optimizer, scheduler):
        model.train()
        loader_iter = iter(loader)
        while True:
            if self.current_step == self.total_steps + 1:
                break
            batch = [t.to(device) for t in next(loader_iter)]
            loss = self.forward_propagation(batch, model)

            if args.fp16:
                with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()

            if self.current_step % self.accumulation_steps == 0:
                optimizer.step()
                scheduler.step()
                model.zero_grad()

            if self.current_step % self.report_steps == 0:
                print("step {} loss {:.4f}".format(self.current_step, self.total_loss / self.report_steps))
                self.total_loss = 0.0
            self.current_step += 1


str2trainer = {"mlm": Trainer}


def worker(args, model):
    set_seed = torch.manual_seed
    set_seed(7)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.01 * step))
    if args.fp16:
        try:
            from apex import amp
        except ImportError:
            raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use fp16 training.")
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
        args.amp = amp
    trainer = str2trainer[args.target](args)
    trainer.train(args, batches(args.batch_size), model, optimizer, scheduler)


if __name__ == "__main__":
    arguments = parser.parse_args()
    torch.manual_seed(0)
    worker(arguments, TinyEncoder())
