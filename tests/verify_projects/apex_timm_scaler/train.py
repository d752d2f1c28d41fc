"""A CPU-sized timm-style training script, written for ampmigrate's tests after the shape of timm's
train.py before 2023 and the vision repositories that copied it (T2T-ViT, VOLO, CSWin-Transformer):
`--apex-amp` / `--native-amp` resolved once into `use_amp`, then

    amp_autocast = suppress
    loss_scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = ApexScaler()
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()

and a `train_one_epoch(..., amp_autocast=..., loss_scaler=...)` that runs the forward pass under
`with amp_autocast():` and the step through `loss_scaler(loss, optimizer, clip_grad=...,
parameters=model_parameters(model, exclude_head="agc" in args.clip_mode))`, plus a `validate(...)`
under the same autocast. The model is a
tiny convolutional classifier on synthetic 8x8 images; `timm` is the stand-in package beside it.

    python train.py --apex-amp
"""
import argparse
from contextlib import suppress

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from timm.models import model_parameters
from timm.utils import ApexScaler, NativeScaler, dispatch_clip_grad

try:
    from apex import amp

    has_apex = True
except ImportError:
    has_apex = False

has_native_amp = False
try:
    if getattr(torch.cuda.amp, "autocast") is not None:
        has_native_amp = True
except AttributeError:
    pass

parser = argparse.ArgumentParser(description="timm-style training")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--clip-grad", type=float, default=1.0)
parser.add_argument("--clip-mode", default="norm", help='"norm", "value" or "agc"')
parser.add_argument("--amp", action="store_true", default=False)
parser.add_argument("--apex-amp", action="store_true", default=False)
parser.add_argument("--native-amp", action="store_true", default=False)
parser.add_argument("--seed", type=int, default=42)


class TinyNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.GELU())
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.block(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def make_loader(samples, seed, batch_size, shuffle):
    prototypes = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=gen)
    images = prototypes[labels] + 0.7 * torch.randn(samples, 3, 8, 8, generator=gen)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=shuffle)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, amp_autocast=suppress, loss_scaler=None):
    model.train()
    total = 0.0
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.cuda(), target.cuda()
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(
                loss,
                optimizer,
                clip_grad=args.clip_grad,
                clip_mode=args.clip_mode,
                parameters=model_parameters(model, exclude_head="agc" in args.clip_mode),
            )
        else:
            loss.backward()
            if args.clip_grad is not None:
                dispatch_clip_grad(model_parameters(model, exclude_head="agc" in args.clip_mode), args.clip_grad, mode=args.clip_mode)
            optimizer.step()
        total += loss.item()
    print(f"epoch {epoch} train loss {total / len(loader):.4f}")


def validate(model, loader, loss_fn, amp_autocast=suppress):
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for input, target in loader:
            input, target = input.cuda(), target.cuda()
            with amp_autocast():
                output = model(input)
                loss_fn(output, target)
            correct += (output.argmax(dim=1) == target).sum().item()
            total += target.numel()
    print(f"val top1 {100.0 * correct / total:.1f}")


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    use_amp = None
    if args.amp:
        if has_apex:
            args.apex_amp = True
        elif has_native_amp:
            args.native_amp = True
    if args.apex_amp and has_apex:
        use_amp = "apex"
    elif args.native_amp and has_native_amp:
        use_amp = "native"
    elif args.apex_amp or args.native_amp:
        print("Neither APEX or native Torch AMP is available, using float32.")

    model = TinyNet().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    # setup automatic mixed-precision (AMP) loss scaling and op casting
    amp_autocast = suppress  # do nothing
    loss_scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = ApexScaler()
        print("Using NVIDIA APEX AMP. Training in mixed precision.")
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()
        print("Using native Torch AMP. Training in mixed precision.")
    else:
        print("AMP not enabled. Training in float32.")

    loader_train = make_loader(640, 1, args.batch_size, shuffle=True)
    loader_eval = make_loader(128, 2, args.batch_size, shuffle=False)
    loss_fn = nn.CrossEntropyLoss().cuda()
    for epoch in range(args.epochs):
        train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args, amp_autocast=amp_autocast, loss_scaler=loss_scaler)
        validate(model, loader_eval, loss_fn, amp_autocast=amp_autocast)


if __name__ == "__main__":
    main()
