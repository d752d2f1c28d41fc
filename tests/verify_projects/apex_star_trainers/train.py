"""Entry point: `python train.py --fp16 [--mode base|finetune|distill]`. The data are synthetic."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from finetune import FinetuneTrainer
from trainer import ModelTrainer, Tagger

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--mode", choices=("base", "finetune", "distill"), default="distill")
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(512, 16).to(device)
classes = features[:, :4].argmax(dim=1)
loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)
model = Tagger().to(device)
if args.mode == "base":
    ModelTrainer(model, loader).train(args.epochs, use_amp=args.fp16)
else:
    teacher = Tagger().to(device).eval() if args.mode == "distill" else None
    FinetuneTrainer(model, loader, teacher=teacher).train(args.epochs, use_amp=args.fp16)
torch.save(model.state_dict(), "model.pt")
