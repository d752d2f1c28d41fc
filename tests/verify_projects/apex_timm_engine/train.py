"""A CPU-sized timm-derived training script whose loop and checkpoint saver live in other files of
its repository, written for ampmigrate's tests after the shape of the vision repositories that
copied timm's train.py (a DeiT-style `engine.py`, a copy of timm's `CheckpointSaver`, the model
star-imported from the repository's own module):

    amp_autocast = suppress
    loss_scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
        loss_scaler = ApexScaler()
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()

with `engine.train_one_epoch(..., amp_autocast=..., loss_scaler=...)` running the forward pass
under `with amp_autocast():` and the step through `loss_scaler(loss, optimizer, clip_grad=...,
parameters=model.parameters())`, `engine.evaluate` under the same autocast, and
`checkpoint_saver.CheckpointSaver(..., amp_scaler=loss_scaler)` saving the scaler's state. apex
runs O2 here (an fp16 model with fp32 master weights). It runs with the stand-in `timm` package
of tests/verify_projects/apex_timm_scaler copied beside it (tests/test_verify_apex_timm_engine.py does).

    python train.py --apex-amp
"""
import argparse
import tempfile
from contextlib import suppress

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from checkpoint_saver import CheckpointSaver
from engine import evaluate, train_one_epoch
from net import *
from timm.utils import ApexScaler, NativeScaler

try:
    from apex import amp

    has_apex = True
except ImportError:
    has_apex = False

parser = argparse.ArgumentParser(description="timm-derived training, loop in engine.py")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--clip-grad", type=float, default=1.0)
parser.add_argument("--apex-amp", action="store_true", default=False)
parser.add_argument("--native-amp", action="store_true", default=False)
parser.add_argument("--seed", type=int, default=42)


def make_loader(samples, seed, batch_size, shuffle):
    prototypes = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=gen)
    images = prototypes[labels] + 0.7 * torch.randn(samples, 3, 8, 8, generator=gen)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=shuffle)


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    use_amp = None
    if args.apex_amp and has_apex:
        use_amp = "apex"
    elif args.native_amp:
        use_amp = "native"

    model = small_convnet().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    amp_autocast = suppress  # do nothing
    loss_scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
        loss_scaler = ApexScaler()
        print("Using NVIDIA APEX AMP. Training in mixed precision.")
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()
        print("Using native Torch AMP. Training in mixed precision.")

    saver = CheckpointSaver(model, optimizer, args=args, amp_scaler=loss_scaler, checkpoint_dir=tempfile.mkdtemp())
    loader_train = make_loader(640, 1, args.batch_size, shuffle=True)
    loader_eval = make_loader(128, 2, args.batch_size, shuffle=False)
    loss_fn = nn.CrossEntropyLoss().cuda()
    for epoch in range(args.epochs):
        train_one_epoch(model, loader_train, optimizer, loss_fn, args, amp_autocast=amp_autocast, loss_scaler=loss_scaler)
        top1 = evaluate(model, loader_eval, amp_autocast=amp_autocast)
        saver.save(epoch, top1)
        print(f"epoch {epoch} val top1 {100.0 * top1:.1f}")


if __name__ == "__main__":
    main()
