"""A conv net that sets the usual cuDNN and TF32 flags before training with fp16 autocast."""

import torch
from torch import nn

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = False
torch.backends.cudnn.enabled = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_tf32 = True
print("cudnn", torch.backends.cudnn.version(), torch.backends.cudnn.is_available())


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 3)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.cuda.amp.GradScaler()
    gen = torch.Generator().manual_seed(2)
    images = torch.randn(256, 1, 8, 8, generator=gen)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long() + (images[:, 0, 0, 0] > 1).long()
    for step in range(10_000):
        index = torch.randint(0, 256, (32,))
        x, y = images[index].cuda(non_blocking=True), labels[index].cuda()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


if __name__ == "__main__":
    main()
