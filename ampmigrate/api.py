"""Qualified names of the PyTorch / apex APIs the rules reason about (see AMP_FACTS.md).

One place for API facts: rules import these sets instead of spelling names themselves, so an
alias the resolver must recognise (say `torch.GradScaler` for `torch.amp.GradScaler`) is added once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Set, Tuple

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
# Other names the legacy submodules re-export from torch.amp unchanged (an import of them moves
# with its neighbours), with the first torch whose torch.amp module has them.
LEGACY_REEXPORTS: Dict[str, Version] = {
    f"torch.{device}.amp.grad_scaler.OptState": (2, 3) for device in ("cuda", "cpu")
}
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

# Floating-point torch dtypes by qualified name, and by the attribute name `getattr(torch, name)`
# takes, each mapped to its canonical name.
DTYPE_ATTRIBUTES: Dict[str, str] = {
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
}
TORCH_DTYPES: Dict[str, str] = {f"torch.{name}": canonical for name, canonical in DTYPE_ATTRIBUTES.items()}

# `torch.get_autocast_dtype(device)` when nothing changed it (torch 2.13).
AUTOCAST_DEFAULT_DTYPE: Dict[str, str] = {
    "cuda": "float16",
    "cpu": "bfloat16",
    "xpu": "float16",
    "mps": "float16",
    "hpu": "bfloat16",
    "xla": "bfloat16",
    "mtia": "float16",
    "maia": "bfloat16",
    "ipu": "float16",
}
# Functions that change that default for the whole process.
SET_AUTOCAST_DTYPE: FrozenSet[str] = frozenset(
    {"torch.set_autocast_dtype", "torch.set_autocast_gpu_dtype", "torch.set_autocast_cpu_dtype"}
)

# ------------------------------------------------------------------ training frameworks (AMP_FACTS §5)
# Hugging Face `TrainingArguments` and the TRL configs that subclass it.
HF_TRAINING_ARGUMENTS: FrozenSet[str] = frozenset(
    {
        "transformers.TrainingArguments",
        "transformers.Seq2SeqTrainingArguments",
        "transformers.training_args.TrainingArguments",
        "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    }
    | {
        f"trl{module}.{name}"
        for module in ("", ".trainer")
        for name in (
            "SFTConfig", "DPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig", "RewardConfig", "GRPOConfig", "PRMConfig",
        )
    }
)
# The Lightning `Trainer` and `Fabric`, under every package name Lightning has shipped them in.
LIGHTNING_TRAINER: FrozenSet[str] = frozenset(
    f"{package}.{path}"
    for package in ("lightning", "lightning.pytorch", "pytorch_lightning")
    for path in ("Trainer", "trainer.Trainer", "trainer.trainer.Trainer")
)
LIGHTNING_FABRIC: FrozenSet[str] = frozenset(
    f"{package}.{path}"
    for package in ("lightning", "lightning.fabric", "lightning_fabric")
    for path in ("Fabric", "fabric.Fabric")
)
ACCELERATOR: FrozenSet[str] = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
DEEPSPEED_INITIALIZE: FrozenSet[str] = frozenset({"deepspeed.initialize"})
# Code that keeps fp32 master weights for a `.half()` model itself.
MASTER_WEIGHT_WRAPPERS: FrozenSet[str] = frozenset(
    {
        "apex.fp16_utils.FP16_Optimizer",
        "apex.fp16_utils.fp16_optimizer.FP16_Optimizer",
        "apex.fp16_utils.network_to_half",
        "apex.amp.initialize",
        "deepspeed.initialize",
    }
)

# Gradient clipping functions (the clip must see unscaled gradients), under every path torch
# exports them from, and the helpers of libraries that call them.
CLIP_GRAD: FrozenSet[str] = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm",
        "torch.nn.utils.clip_grads_with_norm_",  # 2.6+
        "torch.nn.utils.clip_grad.clip_grads_with_norm_",
        "timm.utils.dispatch_clip_grad",
        "timm.utils.clip_grad.dispatch_clip_grad",
    }
)
# `<module>.clip_grad_norm_(max_norm)`: FSDP's (and DeepSpeed's) method form of the same clip.
CLIP_GRAD_METHODS: FrozenSet[str] = frozenset({"clip_grad_norm_", "clip_grad_value_"})
# Functions that compute a norm of the tensors they are given: applied to `.grad`, a grad-norm read.
NORM_FUNCTIONS: FrozenSet[str] = frozenset(
    {
        "torch.norm",
        "torch.linalg.norm",
        "torch.linalg.vector_norm",
        "torch.nn.utils.get_total_norm",  # 2.6+
        "torch.nn.utils.clip_grad.get_total_norm",
        "torch._foreach_norm",
    }
)
# Tensor methods whose result on `p.grad` depends on the gradient's magnitude (norms, clamps).
GRAD_MAGNITUDE_METHODS: FrozenSet[str] = frozenset(
    {"norm", "abs", "pow", "square", "clamp", "clamp_", "clip", "clip_"}
)
# Classes whose `clip_grad_norm_` / `backward` unscale with their own scaler (never flagged).
SELF_UNSCALING: FrozenSet[str] = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# LightningModule: its hooks run under Lightning's own precision plugin, which unscales.
LIGHTNING_MODULE: FrozenSet[str] = frozenset(
    {
        "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule",
        "pytorch_lightning.core.module.LightningModule",
        "lightning.LightningModule",
        "lightning.pytorch.LightningModule",
        "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule",
    }
)
# Optimizer classes (instances of these are what `scaler.step(...)` takes).
OPTIMIZER_MODULES: Tuple[str, ...] = ("torch.optim.", "apex.optimizers.", "bitsandbytes.optim.", "timm.optim.")
NOT_OPTIMIZER_MODULES: Tuple[str, ...] = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
OPTIMIZER_CLASSES: FrozenSet[str] = frozenset({"transformers.AdamW", "transformers.optimization.AdamW"})

# Losses that autocast runs in float32 (the CUDA "autocast to float32" op list): computed
# outside the autocast region on float16 outputs, they run in float16 instead.
_FP32_LOSS_FUNCTIONS = (
    "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss",
    "kl_div", "l1_loss", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss",
    "multi_margin_loss", "nll_loss", "poisson_nll_loss", "smooth_l1_loss", "soft_margin_loss",
    "triplet_margin_loss",
)
_FP32_LOSS_MODULES = (
    "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CrossEntropyLoss", "HingeEmbeddingLoss", "KLDivLoss",
    "L1Loss", "MarginRankingLoss", "MSELoss", "MultiLabelMarginLoss", "MultiMarginLoss", "NLLLoss",
    "PoissonNLLLoss", "SmoothL1Loss", "SoftMarginLoss", "TripletMarginLoss",
)
FP32_AUTOCAST_LOSSES: FrozenSet[str] = frozenset(f"torch.nn.functional.{name}" for name in _FP32_LOSS_FUNCTIONS)
FP32_AUTOCAST_LOSS_CLASSES: FrozenSet[str] = frozenset(
    {f"torch.nn.{name}" for name in _FP32_LOSS_MODULES}
    | {f"torch.nn.modules.loss.{name}" for name in _FP32_LOSS_MODULES}
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
# apex packages that are gone, with when and by which apex PR: importing them fails on a current apex.
APEX_REMOVED: Dict[str, str] = {
    "apex.amp": "May 2025 (apex PR #1896)",
    "apex.fp16_utils": "May 2025 (apex PR #1896)",
    "apex.parallel": "May 2025 (apex PR #1896)",
    "apex.RNN": "May 2025 (apex PR #1896)",
    "apex.reparameterization": "June 2022 (apex PR #1404)",
    "apex.pyprof": "June 2022 (apex PR #1404)",
}
APEX_REMOVED_MODULES: Tuple[str, ...] = tuple(APEX_REMOVED)
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
# The functions `amp.register_half_function(module, "name")` / `register_float_function` may name
# whose op CUDA autocast already casts the same way: fp16 autocast runs them with their floating
# CUDA inputs cast to float16 (`lower_precision_fp`) or float32 (`fp32`, `fp32_set_opt_dtype`), as
# apex O1 did for a registered function. Only public functions that dispatch straight to the op of
# the same name are listed. Source: the `KERNEL_CUDA(...)` table of aten/src/ATen/autocast_mode.cpp
# (https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/autocast_mode.cpp); einsum joined
# it in pytorch/pytorch#71916. bench/gpu/autocast_registrations.py checks every entry on a GPU, bit
# for bit; `sum` is left out: autocast sums fp16 inputs with dtype=float32, which rounds differently
# from apex's cast-then-sum (measured on an H200, bench/gpu/RESULTS.md).
AUTOCAST_CUDA_HALF_OPS: Dict[str, FrozenSet[str]] = {
    "torch": frozenset(
        {"einsum", "matmul", "mm", "bmm", "mv", "addmm", "addmv", "addr", "addbmm", "baddbmm",
         "chain_matmul", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d", "prelu"}
    ),
    "torch.nn.functional": frozenset(
        {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}
    ),
}
AUTOCAST_CUDA_FLOAT_OPS: Dict[str, FrozenSet[str]] = {
    "torch": frozenset(
        {"acos", "asin", "cosh", "sinh", "tan", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
         "reciprocal", "rsqrt", "pow", "softmax", "log_softmax", "cumsum", "cumprod", "prod",
         "logsumexp", "cdist", "cosine_similarity", "layer_norm", "group_norm"}
    ),
    "torch.nn.functional": frozenset(
        {"softplus", "softmax", "log_softmax", "layer_norm", "group_norm", "cosine_similarity", "nll_loss",
         "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy_with_logits",
         "poisson_nll_loss", "margin_ranking_loss", "soft_margin_loss", "multilabel_margin_loss",
         "multi_margin_loss", "hinge_embedding_loss", "cosine_embedding_loss", "triplet_margin_loss", "pdist"}
    ),
}
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

# apex.contrib still ships FusedAdam's FP16_Optimizer (NVIDIA/apex apex/contrib/optimizers/fp16_optimizer.py,
# present at 6424da3, July 2026): not removed, but the same recipe as apex.fp16_utils' (an fp16 model,
# fp32 master weights, manual loss scaling), which torch.amp replaces.
APEX_CONTRIB_FP16_OPTIMIZERS: Dict[str, str] = _apex_names("apex.contrib.optimizers", ("fp16_optimizer",), ("FP16_Optimizer",))

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
    ("DistributedDataParallel", "Reducer", "convert_syncbn_model", "SyncBatchNorm", "LARC", "create_syncbn_process_group"),
)
APEX_MULTI_TENSOR: Dict[str, str] = {
    "apex.multi_tensor_apply.multi_tensor_applier": "multi_tensor_applier",
    "apex.multi_tensor_apply.multi_tensor_apply.multi_tensor_applier": "multi_tensor_applier",
}


# timm's two loss scalers share one call protocol (`scaler(loss, optimizer, clip_grad=None,
# clip_mode="norm", parameters=None, create_graph=False)`, `state_dict()`, `load_state_dict()`,
# `state_dict_key`): `ApexScaler` runs `amp.scale_loss` + backward, clips `amp.master_params`,
# steps; `NativeScaler` runs GradScaler's scale/backward, `unscale_` before the clip, step,
# update (timm/utils/cuda.py, huggingface/pytorch-image-models; re-exported by timm/utils/__init__.py).
# Under apex O1 the second is the first's torch.amp counterpart: {ApexScaler: NativeScaler}.
TIMM_APEX_SCALERS: Dict[str, str] = {
    "timm.utils.ApexScaler": "timm.utils.NativeScaler",
    "timm.utils.cuda.ApexScaler": "timm.utils.cuda.NativeScaler",
}
TIMM_NATIVE_SCALERS: FrozenSet[str] = frozenset(TIMM_APEX_SCALERS.values())
# timm functions that use a loss scaler only through `state_dict()`, `load_state_dict()` and
# `state_dict_key` (checkpointing: timm/models/_helpers.py, timm/utils/checkpoint_saver.py).
TIMM_SCALER_STATE_USERS: FrozenSet[str] = frozenset(
    {
        "timm.models.resume_checkpoint",
        "timm.models.helpers.resume_checkpoint",
        "timm.models._helpers.resume_checkpoint",
        "timm.utils.CheckpointSaver",
        "timm.utils.checkpoint_saver.CheckpointSaver",
    }
)
# `timm.models.model_parameters(model, exclude_head=False)`: `model.parameters()`, or all but
# the last two (the head's weight and bias) with `exclude_head` (timm/models/_helpers.py).
TIMM_MODEL_PARAMETERS: FrozenSet[str] = frozenset(
    {"timm.models.model_parameters", "timm.models.helpers.model_parameters", "timm.models._helpers.model_parameters"}
)
# "Do nothing" context managers a timm-style script binds its autocast variable to by default.
NULL_CONTEXTS: FrozenSet[str] = frozenset({"contextlib.suppress", "contextlib.nullcontext"})
# The star-exports of timm the resolver follows (`from timm.utils import *`, as in timm's train.py).
_TIMM_STAR = {
    "timm.utils": ("ApexScaler", "NativeScaler", "CheckpointSaver"),
    "timm.models": ("resume_checkpoint", "model_parameters"),
}


# torch.optim / torch.nn replacements and the torch release that introduced each.
TORCH_FUSED_ADAMW_SINCE: Version = (2, 0)
TORCH_FUSED_SGD_SINCE: Version = (2, 3)
TORCH_RMSNORM_SINCE: Version = (2, 4)
TORCH_AMP_GRAD_SCALER_SINCE: Version = (2, 3)


def _star_exports() -> Dict[str, FrozenSet[str]]:
    """{module: names} for the modules whose `from M import *` the resolver follows: a free name
    in such a file resolves to `M.name` only when M is known to export it."""
    exports: Dict[str, Set[str]] = {}
    for table in (APEX_AMP_API, APEX_FP16_UTILS, APEX_PARALLEL, APEX_OPTIMIZERS, APEX_NORMS):
        for qname, short in table.items():
            module, _, name = qname.rpartition(".")
            if name == short and not name.startswith("_"):
                exports.setdefault(module, set()).add(name)
    for module, names in _TIMM_STAR.items():
        exports.setdefault(module, set()).update(names)
    return {module: frozenset(names) for module, names in exports.items()}


STAR_EXPORTS: Dict[str, FrozenSet[str]] = _star_exports()


def _modern_since() -> Dict[str, Version]:
    table: Dict[str, Version] = {"torch.amp": (1, 12), "torch.autocast": (1, 12)}
    for api in LEGACY_API.values():
        submodule = "grad_scaler" if api.kind == "grad_scaler" else "autocast_mode"
        table[f"torch.amp.{api.modern}"] = table[f"torch.amp.{submodule}.{api.modern}"] = api.since
    for state in LEGACY_AUTOCAST_STATE.values():
        table[f"torch.{state.modern}"] = state.since
    return table


# The first torch release with each modern mixed-precision name: what a feature probe such as
# `hasattr(torch.amp, "custom_fwd")` finds on every torch at or above it.
MODERN_SINCE: Dict[str, Version] = _modern_since()
# Callables that turn a version string into something ordered like releases.
VERSION_PARSERS: FrozenSet[str] = frozenset(
    {
        "packaging.version.parse",
        "packaging.version.Version",
        "pkg_resources.parse_version",
        "distutils.version.LooseVersion",
        "looseversion.LooseVersion",
    }
)
