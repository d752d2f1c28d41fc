"""AMP403: Hugging Face `TrainingArguments(fp16=True)` -> `bf16=True` (and `fp16_full_eval`)."""

from __future__ import annotations

from typing import Optional

from ampmigrate.analysis.values import literal_value
from ampmigrate.api import HF_TRAINING_ARGUMENTS
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import AMPERE, recommends_bf16_at
from ampmigrate.rules.precision._frameworks import (
    chosen_by_hardware,
    config_literal,
    dict_settings,
    describe_sources,
    follow_setting,
    framework_calls,
    settings_of,
)

FLAGS = (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval"))
BACKEND_ARGS = ("half_precision_backend", "fp16_backend")


def uses_apex_backend(ctx, settings) -> bool:
    """A backend argument that is (or may be) "apex": bf16 raises there in transformers 4.x."""
    return any(
        s.name in BACKEND_ARGS and literal_value(s.value) not in ("auto", "cuda_amp", "amp", "cpu_amp")
        for s in settings
    )


def _deepspeed_blocker(ctx, setting) -> Optional[str]:
    """With `deepspeed=`, bf16 needs a "bf16" section in that config (Hugging Face fills
    `"enabled": "auto"` from the flag); without one DeepSpeed would train in float32."""
    if setting is None or literal_value(setting.value) is None:
        return None
    config = config_literal(ctx, setting.value)
    if config is None:
        return (
            'the DeepSpeed config (`deepspeed=`) is not in this file, so the fix cannot check it has a "bf16" section'
        )
    keys = {s.name for s in dict_settings(ctx, config)}
    if "fp16" in keys and not keys & {"bf16", "bfloat16"}:
        return 'the DeepSpeed config (`deepspeed=`) has an "fp16" section but no "bf16" one; add `"bf16": {"enabled": "auto"}` first'
    return None


class HfFp16TrainingArgs(Rule):
    code = "AMP403"
    triggers = (r"\bfp16",)
    qualified_prefixes = tuple(sorted(HF_TRAINING_ARGUMENTS))

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        for _ref, call in framework_calls(ctx, HF_TRAINING_ARGUMENTS):
            settings = settings_of(ctx, call)
            by_name = {s.name: s for s in settings}
            for old, new in FLAGS:
                setting = by_name.get(old)
                if setting is None:
                    continue
                followed = follow_setting(ctx, setting)
                if not followed.complete or True not in followed.values() or chosen_by_hardware(ctx, setting, followed):
                    continue
                counterpart = by_name.get(new)
                if counterpart is not None:
                    other = follow_setting(ctx, counterpart)
                    if not other.complete or other.values() != {False}:
                        continue  # bf16 is chosen at run time (or already on)
                what = (
                    "trains in float16 with loss scaling"
                    if old == "fp16"
                    else "evaluates with the model cast to float16"
                )
                message = (
                    f"`{old}=True` {what}{describe_sources(ctx, followed, lambda v: v is True)}; "
                    f"on {AMPERE} use `{new}=True`: bfloat16 has float32's range"
                    + (" and needs no scaler" if old == "fp16" else "")
                )
                anchor = setting.anchor
                if uses_apex_backend(ctx, settings):
                    ctx.report(
                        anchor,
                        message,
                        no_fix_reason="bf16 does not run on the apex backend; drop `half_precision_backend` first (AMP404)",
                    )
                    continue
                deepspeed_reason = _deepspeed_blocker(ctx, by_name.get("deepspeed"))
                if old == "fp16" and deepspeed_reason is not None:
                    ctx.report(anchor, message, no_fix_reason=deepspeed_reason)
                    continue
                option = next((s for s in followed.sources if s.option is not None), None)
                if option is not None:
                    ctx.report(
                        anchor,
                        message,
                        no_fix_reason=f"the value comes from {option.via}; pass it as `{new}=` (or rename the option) by hand",
                    )
                    continue
                fix = ctx.fix(f"Use `{new}=` instead of `{old}=`").replace(setting.item, setting.renamed(new))
                if counterpart is not None:
                    fix.replace(counterpart.item, counterpart.renamed(old))
                ctx.report(anchor, message, fix=fix.build())
