"""AMP407: Accelerate `Accelerator(mixed_precision="fp16")` -> `"bf16"`."""

from __future__ import annotations

from ampmigrate.api import ACCELERATOR
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import AMPERE, recommends_bf16_at
from ampmigrate.rules.precision._frameworks import (
    chosen_by_hardware,
    describe_sources,
    follow_setting,
    framework_calls,
    respell_sources,
    settings_of,
)


def _is_fp16(value) -> bool:
    return value == "fp16"


class AccelerateFp16(Rule):
    code = "AMP407"
    triggers = (r"mixed_precision",)
    qualified_prefixes = tuple(sorted(ACCELERATOR))

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        for _ref, call in framework_calls(ctx, ACCELERATOR):
            setting = next((s for s in settings_of(ctx, call) if s.name == "mixed_precision"), None)
            if setting is None:
                continue
            followed = follow_setting(ctx, setting)
            values = followed.values()
            if not followed.complete or "fp16" not in values or values & {"bf16", "fp8"}:
                continue
            if chosen_by_hardware(ctx, setting, followed):
                continue
            message = (
                f'`mixed_precision="fp16"` trains in float16 with a GradScaler{describe_sources(ctx, followed, _is_fp16)}; '
                f'on {AMPERE} use "bf16": bfloat16 has float32\'s range and Accelerate creates no scaler for it'
            )
            edits, reason = respell_sources(ctx, followed, _is_fp16, "bf16")
            if reason is not None:
                ctx.report(setting.anchor, message, no_fix_reason=reason)
                continue
            fix = ctx.fix('Use `mixed_precision="bf16"`')
            for node, new in edits:
                fix.replace(node, new)
            ctx.report(setting.anchor, message, fix=fix.build())
