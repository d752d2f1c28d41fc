"""Run a script written for one CUDA GPU on the CPU, with real CPU reduced-precision autocast.

Used by the harness under `--device cpu` (CI has no GPU). Nothing in the user's files changes:
the torch entry points a single-GPU training script uses are patched in the child process so
that "cuda" means the CPU:

- `.cuda()`, `.to("cuda")` / `.to(0)` / `.to(torch.device("cuda"))` on tensors and modules, and
  `device="cuda"` in factory functions (and so in `nn.Linear(..., device="cuda")`), map to "cpu";
- `torch.cuda.is_available()` is True and the common `torch.cuda` helpers (synchronize,
  device_count, memory statistics, events, streams, seeding) become CPU equivalents or no-ops;
- `autocast("cuda")` (`torch.autocast`, `torch.amp.autocast`, legacy `torch.cuda.amp.autocast`)
  becomes CPU autocast with the dtype CUDA would have used (float16 unless given), and
  `GradScaler("cuda")` (including legacy `torch.cuda.amp.GradScaler`) a CPU GradScaler, so fp16
  code keeps its loss scaling, overflow checks and skipped steps.

`disable_amp()` is the fp32 reference: autocast and GradScaler switched off whatever the script
asks for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import types
from typing import Any, Callable, Dict, List, Tuple

import torch

# What the patches replaced, so tests (and the benchmark) can undo them.
_ORIGINALS: List[Tuple[Any, str, Any]] = []

# Factory functions that take `device=`; wrapped only for their device argument.
_FACTORIES = (
    "tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
    "randperm", "arange", "range", "linspace", "logspace", "eye", "zeros_like", "ones_like",
    "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "empty_strided",
    "tril_indices", "triu_indices", "scalar_tensor", "sparse_coo_tensor", "normal",
    "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
)
_TENSOR_FACTORIES = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full")


def _patch(owner: Any, name: str, value: Any) -> None:
    if not hasattr(owner, name):
        return
    _ORIGINALS.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def restore() -> None:
    """Undo every patch (in reverse order)."""
    while _ORIGINALS:
        owner, name, value = _ORIGINALS.pop()
        setattr(owner, name, value)


def is_cuda(device: Any) -> bool:
    """Whether a device argument names a CUDA device (a bare int is a CUDA index, as in `.to(0)`)."""
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _to_cpu(device: Any) -> Any:
    return "cpu" if is_cuda(device) else device


def _map_device_kwarg(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and is_cuda(device):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)

    return wrapper


def _map_to(func: Callable) -> Callable:
    """`Tensor.to` / `Module.to`: the device may come first, positionally, or as `device=`."""

    @functools.wraps(func)
    def to(self, *args, **kwargs):
        if args and is_cuda(args[0]):
            args = ("cpu",) + args[1:]
        device = kwargs.get("device")
        if device is not None and is_cuda(device):
            kwargs["device"] = "cpu"
        return func(self, *args, **kwargs)

    return to


class _Event:
    """`torch.cuda.Event(enable_timing=True)` on the CPU: records wall-clock time."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.time = None

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_Event") -> float:
        return (end.time - self.time) * 1000.0


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or _Event()
        event.record()
        return event

    def query(self) -> bool:
        return True


# Each patched name gets its own function object: torch._dynamo maps torch functions to tracing
# rules by identity and refuses one object under two names.
def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def _device_properties() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name="CPU (CUDA mapped to CPU by ampmigrate verify)",
        major=8,
        minor=0,
        total_memory=_total_memory(),
        multi_processor_count=os.cpu_count() or 1,
    )


def _nothing():
    def nothing(*args, **kwargs) -> None:
        return None

    return nothing


def _zero():
    def zero(*args, **kwargs) -> int:
        return 0

    return zero


def _null_context():
    def null_context(*args, **kwargs):
        return contextlib.nullcontext()

    return null_context


def map_cuda_to_cpu() -> None:
    """Install the CUDA → CPU mapping (see the module docstring)."""
    amp = torch.amp.autocast_mode
    # float16: what a GPU run would use (the per-device getters exist since torch 2.4).
    per_device = hasattr(torch, "get_autocast_dtype")
    cuda_default_dtype = torch.get_autocast_dtype("cuda") if per_device else torch.float16
    original_get_dtype = getattr(torch, "get_autocast_dtype", None)
    original_is_enabled = torch.is_autocast_enabled

    # tensors and modules
    _patch(torch.Tensor, "to", _map_to(torch.Tensor.to))
    _patch(torch.nn.Module, "to", _map_to(torch.nn.Module.to))
    original_cpu = torch.Tensor.cpu

    def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return original_cpu(self, memory_format=memory_format)

    _patch(torch.Tensor, "cuda", tensor_cuda)
    _patch(torch.nn.Module, "cuda", lambda self, device=None: self)
    _patch(torch.Tensor, "pin_memory", lambda self, device=None: self)
    for name in _FACTORIES:
        if hasattr(torch, name):
            _patch(torch, name, _map_device_kwarg(getattr(torch, name)))
    for name in _TENSOR_FACTORIES:
        _patch(torch.Tensor, name, _map_device_kwarg(getattr(torch.Tensor, name)))
    _patch(torch, "set_default_device", _map_first_arg(torch.set_default_device))
    original_load = torch.load

    @functools.wraps(original_load)
    def load(*args, **kwargs):
        location = kwargs.get("map_location")
        if location is None or is_cuda(location):
            kwargs["map_location"] = "cpu"
        return original_load(*args, **kwargs)

    _patch(torch, "load", load)

    # torch.cuda helpers
    cuda = torch.cuda
    replacements: Dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": _nothing(),
        "device_count": lambda: 1,
        "current_device": _zero(),
        "set_device": _nothing(),
        "synchronize": _nothing(),
        "empty_cache": _nothing(),
        "ipc_collect": _nothing(),
        "get_device_name": lambda *a, **k: "CPU (CUDA mapped to CPU by ampmigrate verify)",
        "get_device_capability": lambda *a, **k: (8, 0),
        "get_device_properties": lambda *a, **k: _device_properties(),
        "mem_get_info": lambda *a, **k: (_total_memory(), _total_memory()),
        "is_bf16_supported": lambda *a, **k: True,
        "manual_seed": _nothing(),
        "manual_seed_all": _nothing(),
        "seed": _nothing(),
        "seed_all": _nothing(),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "set_rng_state_all": lambda states: torch.set_rng_state(states[0]),
        "memory_allocated": _zero(),
        "max_memory_allocated": _zero(),
        "memory_reserved": _zero(),
        "max_memory_reserved": _zero(),
        "reset_peak_memory_stats": _nothing(),
        "reset_max_memory_allocated": _nothing(),
        "device": _null_context(),
        "stream": _null_context(),
        "Stream": _Stream,
        "Event": _Event,
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
    }
    for name, value in replacements.items():
        _patch(cuda, name, value)
    _patch(cuda.amp.common, "amp_definitely_not_available", lambda: False)

    # autocast: "cuda" regions become CPU regions with CUDA's dtype
    original_init = amp.autocast.__init__

    @functools.wraps(original_init)
    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            device_type = "cpu"
            if dtype is None:
                dtype = cuda_default_dtype
        original_init(self, device_type, dtype, enabled, cache_enabled)

    _patch(amp.autocast, "__init__", autocast_init)

    def is_autocast_enabled(device_type=None):
        if device_type is None or device_type == "cuda":
            device_type = "cpu"
        return original_is_enabled(device_type)

    def get_autocast_dtype(device_type):
        if device_type == "cuda":
            return original_get_dtype("cpu") if original_is_enabled("cpu") else cuda_default_dtype
        return original_get_dtype(device_type)

    if per_device:  # before 2.4 these queries take no device and custom_fwd reads the CUDA state only
        _patch(torch, "is_autocast_enabled", is_autocast_enabled)
        _patch(torch, "get_autocast_dtype", get_autocast_dtype)
        _patch(torch, "get_autocast_gpu_dtype", lambda: get_autocast_dtype("cuda"))

    # GradScaler("cuda") becomes a CPU scaler (keeps scaling, inf checks and skipped steps)
    scaler_class = torch.amp.grad_scaler.GradScaler
    original_scaler_init = scaler_class.__init__

    @functools.wraps(original_scaler_init)
    def scaler_init(self, device="cuda", *args, **kwargs):
        original_scaler_init(self, "cpu" if device == "cuda" else device, *args, **kwargs)

    _patch(scaler_class, "__init__", scaler_init)


def _map_first_arg(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(device, *args, **kwargs):
        return func(_to_cpu(device), *args, **kwargs)

    return wrapper


def disable_amp() -> None:
    """The fp32 reference: every autocast region and GradScaler is switched off."""
    autocast_class = torch.amp.autocast_mode.autocast
    original_init = autocast_class.__init__

    @functools.wraps(original_init)
    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        original_init(self, device_type, dtype, False, cache_enabled)

    _patch(autocast_class, "__init__", autocast_init)
    scaler_class = torch.amp.grad_scaler.GradScaler
    original_scaler_init = scaler_class.__init__

    @functools.wraps(original_scaler_init)
    def scaler_init(self, *args, **kwargs):
        kwargs.pop("enabled", None)
        # `enabled` is the last positional parameter (device, init_scale, growth_factor,
        # backoff_factor, growth_interval, enabled); drop it if it was passed positionally.
        args = args[:5]
        original_scaler_init(self, *args, enabled=False, **kwargs)

    _patch(scaler_class, "__init__", scaler_init)
