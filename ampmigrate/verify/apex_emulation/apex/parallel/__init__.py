"""apex.parallel emulated with torch: `DistributedDataParallel` (torch's, or the module itself in a
single process without a process group) and `convert_syncbn_model` (torch.nn.SyncBatchNorm)."""

import torch

from apex import REMOVED_IN_CURRENT_APEX, removed

if REMOVED_IN_CURRENT_APEX:
    raise removed("apex.parallel")

SyncBatchNorm = torch.nn.SyncBatchNorm


class DistributedDataParallel(torch.nn.Module):
    """apex's DDP: gradients all-reduced after backward. Its apex-only options (message_size,
    delay_allreduce, allreduce_always_fp32, ...) only change how, not what, is reduced."""

    def __init__(self, module, message_size=10000000, delay_allreduce=False, shared_param=None,
                 allreduce_trigger_params=None, retain_allreduce_buffers=False, allreduce_always_fp32=False,
                 num_allreduce_streams=1, allreduce_communicators=None, gradient_average=True,
                 gradient_predivide_factor=1.0, gradient_average_split_factor=None, prof=False):
        super().__init__()
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.module = module
        self._ddp = torch.nn.parallel.DistributedDataParallel(module) if distributed else None

    def forward(self, *args, **kwargs):
        return (self._ddp or self.module)(*args, **kwargs)


def convert_syncbn_model(module, process_group=None, channel_last=False):
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
