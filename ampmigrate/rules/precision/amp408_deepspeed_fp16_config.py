"""AMP408: a DeepSpeed config dict written in Python with `"fp16": {"enabled": True, ...}`
-> `"bf16": {"enabled": True}` (the loss-scale keys have no bf16 meaning and are dropped).

Only dicts that are clearly DeepSpeed configs count: passed to `deepspeed.initialize(config=...)`
or `TrainingArguments(deepspeed=...)`, or holding DeepSpeed-only keys (`zero_optimization`,
`train_micro_batch_size_per_gpu`, ...) or DeepSpeed's loss-scale keys in their fp16 section.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional

import libcst as cst

from ampmigrate.analysis.values import literal_value, respell_string
from ampmigrate.api import DEEPSPEED_INITIALIZE, HF_TRAINING_ARGUMENTS
from ampmigrate.engine.ast_nodes import nodes_of
from ampmigrate.engine.context import without_items
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import AMPERE, in_bf16_choice, recommends_bf16_at
from ampmigrate.rules.precision._frameworks import Setting, config_literal, dict_settings, framework_calls, settings_of

LOSS_SCALE_KEYS = frozenset(
    {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"}
)
DEEPSPEED_ONLY_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "zero_optimization",
        "zero_allow_untested_optimizer",
        "steps_per_print",
        "wall_clock_breakdown",
        "zero_force_ds_cpu_optimizer",
        "activation_checkpointing",
    }
)


class DeepSpeedFp16Config(Rule):
    code = "AMP408"
    # A quoted "fp16"; the look-behind keeps the literal first (a fast scan).
    triggers = (r"fp16(?<=[\"']fp16)[\"']",)

    def screen(self, tree: ast.Module) -> bool:
        return any(_enables_fp16(display) for display in nodes_of(tree, ast.Dict))

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        passed = _configs_passed_to_deepspeed(ctx)
        for config in _dict_displays(ctx):
            entries = {s.name: s for s in dict_settings(ctx, config)}
            fp16 = entries.get("fp16")
            if fp16 is None or not isinstance(fp16.value, cst.Dict):
                continue
            section = {s.name: s for s in dict_settings(ctx, fp16.value)}
            enabled = section.get("enabled")
            if enabled is None or literal_value(enabled.value) is not True:
                continue  # off, or "auto" (Hugging Face fills it from TrainingArguments)
            if (
                config not in passed
                and not (DEEPSPEED_ONLY_KEYS & set(entries))
                and not (LOSS_SCALE_KEYS & set(section))
            ):
                continue  # not recognisably a DeepSpeed config
            if in_bf16_choice(ctx, config):
                continue
            self._report(ctx, fp16, section, entries.get("bf16") or entries.get("bfloat16"))

    def _report(self, ctx, fp16: Setting, section: Dict[str, Setting], bf16: Optional[Setting]) -> None:
        message = (
            f'DeepSpeed `"fp16"` trains in float16 with loss scaling; on {AMPERE} use '
            '`"bf16": {"enabled": True}`: bfloat16 has float32\'s range and needs no loss scaling'
        )
        if bf16 is not None:
            other = dict_settings(ctx, bf16.value) if isinstance(bf16.value, cst.Dict) else []
            switch = next((s for s in other if s.name == "enabled"), None)
            if switch is None or literal_value(switch.value) is not False:
                return  # bf16 already on, or chosen elsewhere ("auto")
            fix = ctx.fix('Enable the "bf16" section and disable "fp16"')
            fix.replace(section["enabled"].value, cst.Name("False")).replace(switch.value, cst.Name("True"))
            ctx.report(fp16.anchor, message, fix=fix.build())
            return
        others = [name for name in section if name != "enabled" and name not in LOSS_SCALE_KEYS]
        others = [n for n in others if not (n == "auto_cast" and literal_value(section[n].value) is False)]
        if others:
            ctx.report(
                fp16.anchor,
                message,
                no_fix_reason=f"the fp16 section's {', '.join(repr(n) for n in others)} has no bf16 counterpart",
            )
            return
        dropped = [s for s in section.values() if s.name != "enabled"]
        new_section = without_items(fp16.value, [s.item for s in dropped]) if dropped else fp16.value
        new_item = fp16.item.with_changes(key=respell_string(fp16.item.key, "bf16"), value=new_section)
        note = f" (drops {', '.join(s.name for s in dropped)}: bf16 needs no loss scaling)" if dropped else ""
        fix = ctx.fix(f'Use a "bf16" section{note}').replace(fp16.item, new_item)
        ctx.report(fp16.anchor, message, fix=fix.build())


def _enables_fp16(display: ast.Dict) -> bool:
    """The `ast` twin of what `check` reports at: a dict display with a string key "fp16" whose
    value is a dict display with "enabled" set to `True` (a superset: `ast` joins "fp" "16")."""
    for key, value in zip(display.keys, display.values):
        if _is_key(key, "fp16") and isinstance(value, ast.Dict):
            if any(_is_key(k, "enabled") and isinstance(v, ast.Constant) and v.value is True for k, v in zip(value.keys, value.values)):
                return True
    return False


def _is_key(key: Optional[ast.AST], name: str) -> bool:
    return isinstance(key, ast.Constant) and key.value == name


def _dict_displays(ctx) -> List[cst.Dict]:
    return ctx.names.nodes_of_type(cst.Dict)


def _configs_passed_to_deepspeed(ctx) -> List[cst.CSTNode]:
    """Dicts given to `deepspeed.initialize(config=...)` or `TrainingArguments(deepspeed=...)`."""
    passed = []
    for qnames, keywords in (
        (DEEPSPEED_INITIALIZE, ("config", "config_params")),
        (HF_TRAINING_ARGUMENTS, ("deepspeed",)),
    ):
        for _ref, call in framework_calls(ctx, qnames):
            for setting in settings_of(ctx, call):
                if setting.name in keywords:
                    config = config_literal(ctx, setting.value)
                    if config is not None:
                        passed.append(config)
    return passed
