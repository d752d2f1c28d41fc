"""Script shapes the harness adapts to, without editing the script (child side, imports torch).

- torchrun-style scripts run as one process, as `torchrun --nproc_per_node=1` would start them:
  `RANK`/`LOCAL_RANK`/`WORLD_SIZE`/`LOCAL_WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT` are set where
  the environment lacks them; with CUDA mapped to the CPU, `init_process_group` uses gloo (NCCL
  needs a GPU), `DistributedDataParallel(model, device_ids=[local_rank])` gets no device ids (a
  CPU module takes none) and `SyncBatchNorm.convert_sync_batchnorm` keeps plain batch norm (one
  process has nothing to synchronise, and SyncBatchNorm refuses CPU tensors);
- with CUDA mapped to the CPU, the legacy tensor types (`torch.cuda.FloatTensor`,
  `x.type(torch.cuda.HalfTensor)`, `x.type("torch.cuda.LongTensor")`,
  `torch.set_default_tensor_type("torch.cuda.FloatTensor")`) are their CPU types.

`torch.backends.cudnn` flags need nothing: they are plain attributes on any build.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any

from ampmigrate.verify.devicemap import _patch

_LEGACY_TYPES = (
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
    "ShortTensor", "IntTensor", "LongTensor", "BoolTensor",
)


def install(torch: Any, mapped: bool) -> None:
    """`mapped`: CUDA is mapped to the CPU in this run (devicemap)."""
    single_process_environment()
    if mapped:
        map_legacy_tensor_types(torch)
        map_distributed_to_cpu(torch)


def single_process_environment() -> None:
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cpu_type_name(name: Any) -> Any:
    if isinstance(name, str) and name.startswith("torch.cuda."):
        return "torch." + name[len("torch.cuda."):]
    return name


def map_legacy_tensor_types(torch: Any) -> None:
    for name in _LEGACY_TYPES:
        if hasattr(torch, name):
            _patch(torch.cuda, name, getattr(torch, name))
    original_type = torch.Tensor.type

    @functools.wraps(original_type)
    def tensor_type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None:
            return original_type(self)
        return original_type(self, _cpu_type_name(dtype), non_blocking, **kwargs)

    _patch(torch.Tensor, "type", tensor_type)
    if hasattr(torch, "set_default_tensor_type"):
        original_default = torch.set_default_tensor_type

        @functools.wraps(original_default)
        def set_default_tensor_type(kind):
            return original_default(_cpu_type_name(kind))

        _patch(torch, "set_default_tensor_type", set_default_tensor_type)


def map_distributed_to_cpu(torch: Any) -> None:
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available():
        return
    import torch.distributed.distributed_c10d as c10d

    original_init = c10d.init_process_group

    @functools.wraps(original_init)
    def init_process_group(backend=None, *args, **kwargs):
        if backend is None or "nccl" in str(backend):
            backend = "gloo"
        kwargs.pop("device_id", None)  # a CUDA device to bind the group to
        return original_init(backend, *args, **kwargs)

    _patch(c10d, "init_process_group", init_process_group)
    _patch(distributed, "init_process_group", init_process_group)

    ddp = torch.nn.parallel.DistributedDataParallel
    original_ddp_init = ddp.__init__

    @functools.wraps(original_ddp_init)
    def ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        original_ddp_init(self, module, None, None, *args, **kwargs)

    _patch(ddp, "__init__", ddp_init)
    sync = torch.nn.SyncBatchNorm
    _patch(sync, "convert_sync_batchnorm", classmethod(lambda cls, module, process_group=None: module))
