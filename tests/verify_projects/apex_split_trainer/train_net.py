#!/usr/bin/env python
"""A CPU-sized reduction, written for ampmigrate's tests, of facebookresearch/maskrcnn-benchmark's
tools/train_net.py with maskrcnn_benchmark/engine/trainer.py (here trainer.py): `from apex import
amp` under a `try` that re-raises, `amp_opt_level = 'O1' if use_mixed_precision else 'O0'` and
`model, optimizer = amp.initialize(model, optimizer, opt_level=amp_opt_level)` in `train()`, which
then calls `do_train(model, data_loader, optimizer, scheduler, ...)` imported from trainer.py, where
the loss is scaled (`with amp.scale_loss(losses, optimizer) as scaled_losses`). The detector is a
tiny two-head model whose forward returns a dict of losses in training, on synthetic images.

    python train_net.py --dtype float16

Two shapes of a person-search project built on the same recipe are added: `train()` also hands the
optimizer to trainer.py's `adjust_lr()` (a warm-up that only tunes the learning rate), and saves
`amp.state_dict()` in each epoch's checkpoint beside the model's.
"""

import argparse
import os

import torch
from torch import nn

from trainer import adjust_lr, do_train

# See if we can use apex.DistributedDataParallel instead of the torch default,
# and enable mixed-precision via apex.amp
try:
    from apex import amp
except ImportError:
    raise ImportError('Use APEX for multi-precision via apex.amp')


class TinyDetector(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls_head = nn.Linear(16, num_classes)
        self.box_head = nn.Linear(16, 4)

    def forward(self, images, targets=None):
        features = self.backbone(images)
        logits, boxes = self.cls_head(features), self.box_head(features)
        if not self.training:
            return logits, boxes
        labels, gt_boxes = targets
        return {
            "loss_classifier": nn.functional.cross_entropy(logits, labels),
            "loss_box_reg": nn.functional.smooth_l1_loss(boxes, gt_boxes),
        }


def make_data_loader(batches, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    loader = []
    for _ in range(batches):
        images = torch.randn(batch_size, 3, 16, 16, generator=gen)
        labels = torch.randint(0, 5, (batch_size,), generator=gen)
        boxes = torch.rand(batch_size, 4, generator=gen)
        loader.append((images, (labels, boxes)))
    return loader


def train(cfg):
    model = TinyDetector()
    device = torch.device(cfg.device)
    model.to(device)

    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[40], gamma=0.1)

    # Initialize mixed-precision training
    use_mixed_precision = cfg.dtype == "float16"
    amp_opt_level = 'O1' if use_mixed_precision else 'O0'
    model, optimizer = amp.initialize(model, optimizer, opt_level=amp_opt_level)

    data_loader = make_data_loader(cfg.max_iter // cfg.epochs, cfg.batch_size)
    arguments = {"iteration": 0}

    for epoch in range(cfg.epochs):
        if epoch < 2:  # warm up in the first epoch, back to the base rate in the second
            adjust_lr(optimizer, cfg.warmup_factor if epoch == 0 else 1.0 / cfg.warmup_factor)
        do_train(
            model,
            data_loader,
            optimizer,
            scheduler,
            device,
            arguments,
        )

        os.makedirs(cfg.output_dir, exist_ok=True)
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "amp": amp.state_dict()},
            os.path.join(cfg.output_dir, f"epoch_{epoch}.pth"),
        )
    return model


def main():
    parser = argparse.ArgumentParser(description="PyTorch Object Detection Training")
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup-factor", type=float, default=0.5)
    parser.add_argument("--output-dir", default="output")
    cfg = parser.parse_args()
    train(cfg)


if __name__ == "__main__":
    main()
