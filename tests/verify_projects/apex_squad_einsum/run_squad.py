"""Span-extraction fine-tuning in the shape of transformers' `run_squad.py` (2020): einsum is
registered as an apex half function before anything else, `amp.initialize` runs in `train()`,
the loss is scaled by `amp.scale_loss` and gradients are clipped on `amp.master_params`.
A tiny einsum attention model on synthetic data stands in for XLNet."""

import argparse

import torch
import torch.nn as nn


class EinsumAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Parameter(torch.randn(hidden, heads, hidden // heads) * 0.1)
        self.k = nn.Parameter(torch.randn(hidden, heads, hidden // heads) * 0.1)
        self.v = nn.Parameter(torch.randn(hidden, heads, hidden // heads) * 0.1)
        self.o = nn.Parameter(torch.randn(hidden, heads, hidden // heads) * 0.1)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, h):  # h: (seq, batch, hidden), XLNet's layout
        q = torch.einsum("ibh,hnd->ibnd", h, self.q)
        k = torch.einsum("ibh,hnd->ibnd", h, self.k)
        v = torch.einsum("ibh,hnd->ibnd", h, self.v)
        scores = torch.einsum("ibnd,jbnd->bnij", q, k) / q.size(-1) ** 0.5
        probs = torch.softmax(scores, dim=-1)
        attended = torch.einsum("bnij,jbnd->ibnd", probs, v)
        return self.norm(h + torch.einsum("ibnd,hnd->ibh", attended, self.o))


class SpanModel(nn.Module):
    def __init__(self, vocab=50, hidden=32, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([EinsumAttention(hidden, heads) for _ in range(2)])
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, input_ids, start_positions, end_positions):
        h = self.embed(input_ids).transpose(0, 1)
        for layer in self.layers:
            h = layer(h)
        start_logits, end_logits = self.qa_outputs(h.transpose(0, 1)).unbind(-1)
        loss_fct = nn.CrossEntropyLoss()
        return (loss_fct(start_logits, start_positions) + loss_fct(end_logits, end_positions)) / 2


def make_batches(count=64, batch=16, length=24, vocab=50, seed=7):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, vocab, (batch, length), generator=gen)
        start = torch.randint(0, length - 4, (batch,), generator=gen)
        ids[torch.arange(batch), start] = 0  # the answer starts after a marker token
        batches.append((ids, start, start + 3))
    return batches


def train(args, model, batches):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    if args.fp16:
        try:
            from apex import amp
        except ImportError:
            raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use fp16 training.")
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
    model.train()
    for epoch in range(args.epochs):
        for input_ids, start, end in batches:
            loss = model(input_ids.cuda(), start.cuda(), end.cuda())
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            model.zero_grad()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--fp16_opt_level", default="O1")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    # Before we do anything with models, we want to ensure that we get fp16 execution of torch.einsum if args.fp16 is set.
    # Otherwise it'll default to "promote" mode, and we'll get fp32 operations. Note that running `--fp16_opt_level="O2"` will
    # remove the need for this code, but it is still valid.
    if args.fp16:
        try:
            import apex

            apex.amp.register_half_function(torch, "einsum")
        except ImportError:
            raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use fp16 training.")

    torch.manual_seed(42)
    model = SpanModel().cuda()
    train(args, model, make_batches())


if __name__ == "__main__":
    main()
