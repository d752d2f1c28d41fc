"""A CPU-sized k-fold training script written for ampmigrate's tests, after the shape common in
Kaggle competition code: a fold loop at the top level that builds a new model, optimizer and
scheduler per fold, `model, optimizer = amp.initialize(model, optimizer, opt_level="O1")` under
`if args.fp16:` inside the loop, and `train_one_epoch(...)` / `validate(...)` functions of the same
file that scale the loss with `amp.scale_loss` and clip `amp.master_params(optimizer)`. apex made new
loss scalers at every `amp.initialize`, so every fold starts from the initial loss scale. The data
are synthetic 16-feature samples of 4 classes; each fold holds one part out for validation.

    python train.py --fp16
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--folds", type=int, default=3)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--max_grad_norm", type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(0)
NUM_CLASSES = 4
centers = torch.randn(NUM_CLASSES, 16) * 2
labels = torch.randint(0, NUM_CLASSES, (480,))
features = centers[labels] + torch.randn(480, 16)
dataset = TensorDataset(features, labels)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def train_one_epoch(model, optimizer, scheduler, loader, criterion):
    model.train()
    total = 0.0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        logits = model(inputs)
        loss = criterion(logits, targets)
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        total += loss.item()
    return total / len(loader)


def validate(model, loader, criterion):
    model.eval()
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            logits = model(inputs)
            total_loss += criterion(logits, targets).item()
            correct += (logits.argmax(dim=1) == targets).sum().item()
    return total_loss / len(loader), correct / len(loader.dataset)


fold_size = len(dataset) // args.folds
scores = []
for fold in range(args.folds):
    held_out = list(range(fold * fold_size, (fold + 1) * fold_size))
    kept = [i for i in range(len(dataset)) if i < fold * fold_size or i >= (fold + 1) * fold_size]
    train_loader = DataLoader(Subset(dataset, kept), batch_size=args.batch_size, shuffle=True)
    valid_loader = DataLoader(Subset(dataset, held_out), batch_size=args.batch_size)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        train_loss = train_one_epoch(model, optimizer, scheduler, train_loader, criterion)
        valid_loss, accuracy = validate(model, valid_loader, criterion)
        print(f"fold {fold} epoch {epoch}: train {train_loss:.4f} valid {valid_loss:.4f} acc {accuracy:.3f}")
    scores.append(accuracy)
    torch.save(model.state_dict(), f"fold{fold}.pt")

print("cv accuracy", sum(scores) / len(scores))
