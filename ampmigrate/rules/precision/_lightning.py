"""Lightning's `precision=` argument: which values mean what, and which Lightning the code targets.

Lightning 2.0 renamed the precision values: `16`/`"16"` became `"16-mixed"` and `"bf16"`
`"bf16-mixed"` (the old ones still work, with a "supported for historical reasons" warning).
Lightning 1.x accepts only `64, 32, 16, "bf16"`, so code that passes an argument removed in 2.0
(`gpus=`, `amp_backend=`, ...) is written for 1.x and keeps the 1.x spellings.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from ampmigrate.api import LIGHTNING_FABRIC, LIGHTNING_TRAINER
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.rules.precision._frameworks import Setting, framework_calls, settings_of

FP16_MIXED = (16, "16", "16-mixed")
FP16_ALIASES = (16, "16")
BF16_VALUES = ("bf16", "bf16-mixed", "bf16-true")

# Trainer arguments that Lightning 2.0 (or 1.7) removed: their presence dates the code to 1.x.
LIGHTNING_1_ONLY = frozenset(
    {
        "gpus",
        "tpu_cores",
        "ipus",
        "num_processes",
        "amp_backend",
        "amp_level",
        "auto_select_gpus",
        "auto_scale_batch_size",
        "auto_lr_find",
        "move_metrics_to_cpu",
        "multiple_trainloader_mode",
        "replace_sampler_ddp",
        "resume_from_checkpoint",
        "track_grad_norm",
        "weights_save_path",
        "progress_bar_refresh_rate",
        "weights_summary",
        "checkpoint_callback",
        "flush_logs_every_n_steps",
        "terminate_on_nan",
        "stochastic_weight_avg",
        "prepare_data_per_node",
        "log_gpu_memory",
        "process_position",
        "distributed_backend",
        "reload_dataloaders_every_epoch",
        "truncated_bptt_steps",
    }
)


def precision_settings(ctx) -> List[Tuple[Setting, List[Setting], bool]]:
    """(the `precision` setting, all settings of its call, is the code for Lightning 1.x)."""
    found = []
    for _ref, call in framework_calls(ctx, LIGHTNING_TRAINER | LIGHTNING_FABRIC):
        settings = settings_of(ctx, call)
        precision = next((s for s in settings if s.name == "precision"), None)
        if precision is None:
            continue
        lightning_1 = any(s.name in LIGHTNING_1_ONLY for s in settings)
        found.append((precision, settings, lightning_1))
    return found


def spells_a_value(tree: ast.Module, values: Tuple[object, ...]) -> bool:
    """Whether a literal of the file equals one of `values`: what a `screen` asks of a rule that
    reports only a `precision` followed to such a literal (values.literal_value: a string or
    number literal; `ast` folds `0x10` to 16 and joins "1" "6", so this over-approximates)."""
    wanted = set(values)
    return any(_hashable_in(node.value, wanted) for node in nodes_of(tree, ast.Constant))


def _hashable_in(value: object, wanted: set) -> bool:
    try:
        return value in wanted
    except TypeError:
        return False


def bf16_mixed(lightning_1: bool) -> str:
    return "bf16" if lightning_1 else "bf16-mixed"


def setting_named(settings: List[Setting], name: str) -> Optional[Setting]:
    return next((s for s in settings if s.name == name), None)
