"""Qualified names of the PyTorch / apex APIs the rules reason about (see AMP_FACTS.md).

One place for API facts: rules import these sets instead of spelling names themselves, so an
alias the resolver must recognise (say `torch.GradScaler` for `torch.amp.GradScaler`) is added once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

Version = Tuple[int, int]

# Modern autocast: `torch.autocast is torch.amp.autocast` (1.10+ / 1.12+).
AUTOCAST: FrozenSet[str] = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
)
# Modern GradScaler: `torch.GradScaler is torch.amp.GradScaler` (2.3+).
GRAD_SCALER: FrozenSet[str] = frozenset(
    {"torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"}
)
SHARDED_GRAD_SCALER: FrozenSet[str] = frozenset(
    {
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
        "torch.distributed.fsdp.ShardedGradScaler",
    }
)


@dataclass(frozen=True)
class LegacyApi:
    """A deprecated `torch.cuda.amp` / `torch.cpu.amp` object and its `torch.amp` replacement."""

    kind: str  # "autocast" | "grad_scaler" | "custom_fwd" | "custom_bwd"
    device: str  # the device the legacy spelling implied
    modern: str  # its name under torch.amp
    params: Tuple[str, ...]  # the legacy signature's positional parameters, in order
    since: Version  # first torch with the modern spelling


_AUTOCAST_PARAMS = ("enabled", "dtype", "cache_enabled")
_SCALER_PARAMS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


def _legacy_table() -> Dict[str, LegacyApi]:
    table: Dict[str, LegacyApi] = {}
    for device in ("cuda", "cpu"):
        autocast = LegacyApi("autocast", device, "autocast", _AUTOCAST_PARAMS, (1, 12))
        scaler = LegacyApi("grad_scaler", device, "GradScaler", _SCALER_PARAMS, (2, 3))
        for path in ("autocast", "autocast_mode.autocast"):
            table[f"torch.{device}.amp.{path}"] = autocast
        for path in ("GradScaler", "grad_scaler.GradScaler"):
            table[f"torch.{device}.amp.{path}"] = scaler
    for name, param in (("custom_fwd", "fwd"), ("custom_bwd", "bwd")):
        api = LegacyApi(name, "cuda", name, (param,), (2, 4))
        table[f"torch.cuda.amp.{name}"] = api
        table[f"torch.cuda.amp.autocast_mode.{name}"] = api
    return table


LEGACY_API: Dict[str, LegacyApi] = _legacy_table()
LEGACY_AMP_MODULES: FrozenSet[str] = frozenset({"torch.cuda.amp", "torch.cpu.amp"})

LEGACY_AUTOCAST: FrozenSet[str] = frozenset(q for q, a in LEGACY_API.items() if a.kind == "autocast")
LEGACY_GRAD_SCALER: FrozenSet[str] = frozenset(
    q for q, a in LEGACY_API.items() if a.kind == "grad_scaler"
)
ANY_AUTOCAST: FrozenSet[str] = AUTOCAST | LEGACY_AUTOCAST
ANY_GRAD_SCALER: FrozenSet[str] = GRAD_SCALER | LEGACY_GRAD_SCALER | SHARDED_GRAD_SCALER


@dataclass(frozen=True)
class LegacyStateApi:
    """A global autocast getter/setter with a device-specific name (hidden DeprecationWarning)."""

    modern: str
    device: str
    since: Version = (2, 4)


LEGACY_AUTOCAST_STATE: Dict[str, LegacyStateApi] = {
    "torch.get_autocast_gpu_dtype": LegacyStateApi("get_autocast_dtype", "cuda"),
    "torch.get_autocast_cpu_dtype": LegacyStateApi("get_autocast_dtype", "cpu"),
    "torch.set_autocast_gpu_dtype": LegacyStateApi("set_autocast_dtype", "cuda"),
    "torch.set_autocast_cpu_dtype": LegacyStateApi("set_autocast_dtype", "cpu"),
    "torch.set_autocast_cpu_enabled": LegacyStateApi("set_autocast_enabled", "cpu"),
    "torch.is_autocast_cpu_enabled": LegacyStateApi("is_autocast_enabled", "cpu"),
}

FLOAT16: FrozenSet[str] = frozenset({"torch.float16", "torch.half"})
BFLOAT16: FrozenSet[str] = frozenset({"torch.bfloat16"})

# Gradient clipping functions (the clip must see unscaled gradients).
CLIP_GRAD: FrozenSet[str] = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)


def parse_version(text: str) -> Version:
    """'2.4' -> (2, 4); raises ValueError with a readable message."""
    parts = text.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"expected a torch version like 2.4, got {text!r}")
    return int(parts[0]), int(parts[1])


def format_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


# --------------------------------------------------------------------------------- NVIDIA apex
# apex.amp, apex.fp16_utils and apex.parallel were removed from apex on 2025-05-08 (PR #1896);
# apex.optimizers and apex.normalization remain (AMP_FACTS.md section 4).


def _apex_names(module: str, submodules: Tuple[str, ...], names: Tuple[str, ...]) -> Dict[str, str]:
    """{qualified name: short name} for `names` exported by `module` and defined in its submodules."""
    table: Dict[str, str] = {}
    for name in names:
        table[f"{module}.{name}"] = name
        for sub in submodules:
            table[f"{module}.{sub}.{name}"] = name
    return table


APEX_AMP_MODULE = "apex.amp"
# Every public apex.amp function, by qualified name (also as defined in its submodule).
APEX_AMP_API: Dict[str, str] = _apex_names(
    APEX_AMP_MODULE,
    ("frontend", "handle", "amp", "_amp_state"),
    (
        "initialize",
        "scale_loss",
        "master_params",
        "state_dict",
        "load_state_dict",
        "disable_casts",
        "init",
        "half_function",
        "float_function",
        "promote_function",
        "register_half_function",
        "register_float_function",
        "register_promote_function",
        "_amp_state",
    ),
)
APEX_AMP_CAST_ANNOTATIONS: FrozenSet[str] = frozenset(
    {"half_function", "float_function", "promote_function", "register_half_function",
     "register_float_function", "register_promote_function"}
)
APEX_FP16_UTILS: Dict[str, str] = _apex_names(
    "apex.fp16_utils",
    ("fp16_optimizer", "fp16util", "loss_scaler"),
    (
        "FP16_Optimizer",
        "network_to_half",
        "BN_convert_float",
        "prep_param_lists",
        "model_grads_to_master_grads",
        "master_params_to_model_params",
        "tofp16",
        "to_python_float",
        "clip_grad_norm",
        "convert_module",
        "convert_network",
        "FP16Model",
        "LossScaler",
        "DynamicLossScaler",
    ),
)
# Old apex releases also shipped an FP16_Optimizer for FusedAdam under apex.optimizers.
APEX_FP16_UTILS["apex.optimizers.FP16_Optimizer"] = "FP16_Optimizer"
APEX_FP16_UTILS["apex.optimizers.fp16_optimizer.FP16_Optimizer"] = "FP16_Optimizer"

APEX_OPTIMIZERS: Dict[str, str] = _apex_names(
    "apex.optimizers",
    ("fused_adam", "fused_sgd", "fused_lamb", "fused_novograd", "fused_adagrad", "fused_mixed_precision_lamb"),
    ("FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad", "FusedMixedPrecisionLamb"),
)
APEX_NORMS: Dict[str, str] = _apex_names(
    "apex.normalization",
    ("fused_layer_norm",),
    ("FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"),
)
APEX_PARALLEL: Dict[str, str] = _apex_names(
    "apex.parallel",
    ("distributed", "sync_batchnorm", "optimized_sync_batchnorm", "LARC"),
    ("DistributedDataParallel", "Reducer", "convert_syncbn_model", "SyncBatchNorm", "LARC"),
)
APEX_MULTI_TENSOR: Dict[str, str] = {
    "apex.multi_tensor_apply.multi_tensor_applier": "multi_tensor_applier",
    "apex.multi_tensor_apply.multi_tensor_apply.multi_tensor_applier": "multi_tensor_applier",
}


# torch.optim / torch.nn replacements and the torch release that introduced each.
TORCH_FUSED_ADAMW_SINCE: Version = (2, 0)
TORCH_FUSED_SGD_SINCE: Version = (2, 3)
TORCH_RMSNORM_SINCE: Version = (2, 4)
TORCH_AMP_GRAD_SCALER_SINCE: Version = (2, 3)
