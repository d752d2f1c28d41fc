"""A CPU-sized training script written for ampmigrate's tests, after HF's
transfer-learning-conv-ai `train.py` (and its descendants, such as thu-coai/CDial-GPT): `--fp16`
is apex's opt level as a string, empty for fp32 training (the default), and the script tests it for
truth (`if args.fp16:`) before `amp.initialize(model, optimizer, opt_level=args.fp16)`. The data
are synthetic: a 4-class classification on 16 features.

    python train.py --fp16 O1
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", type=str, default="", help="Set to O0, O1, O2 or O3 for fp16 training (see apex documentation)")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--max_norm", type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(512, 16)
classes = features[:, :4].argmax(dim=1)
loader = DataLoader(TensorDataset(features, classes), batch_size=32, shuffle=True)

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if args.fp16:
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16)

step = 0
for epoch in range(args.epochs):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        optimizer.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")
torch.save(model.state_dict(), "model.pt")
