"""An evaluation script with legacy autocast but no training loop: nothing calls backward()."""

import torch
from torch import nn


def main():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).cuda().eval()
    correct = 0
    with torch.no_grad():
        for _ in range(20):
            x = torch.randn(64, 8).cuda()
            with torch.cuda.amp.autocast():
                logits = model(x)
            correct += (logits.argmax(dim=1) == 0).sum().item()
    print(f"class-0 predictions: {correct}")


if __name__ == "__main__":
    main()
