"""A `torchrun --nproc_per_node=N ddp_torchrun.py` script: env ranks, NCCL, DDP, DistributedSampler."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(0)

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=gen)
    data = TensorDataset(x, (x[:, :4].sum(dim=1) > 0).long())
    sampler = DistributedSampler(data, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    loader = DataLoader(data, batch_size=32, sampler=sampler)

    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = nn.functional.cross_entropy(model(inputs), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "ddp_last.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
