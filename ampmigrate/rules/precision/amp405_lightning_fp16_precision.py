"""AMP405: Lightning `Trainer`/`Fabric(precision=16 | "16" | "16-mixed")` -> `"bf16-mixed"`."""

from __future__ import annotations

from ampmigrate.analysis.values import literal_value
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import AMPERE, recommends_bf16_at
from ampmigrate.rules.precision._frameworks import chosen_by_hardware, describe_sources, follow_setting, respell_sources
from ampmigrate.rules.precision._lightning import (
    BF16_VALUES,
    FP16_MIXED,
    bf16_mixed,
    precision_settings,
    setting_named,
)
from ampmigrate.rules.precision._precision_screen import precision_may_be
from ampmigrate.api import LIGHTNING_FABRIC, LIGHTNING_TRAINER


def _is_fp16(value) -> bool:
    return value in FP16_MIXED and not isinstance(value, bool)


class LightningFp16Precision(Rule):
    code = "AMP405"
    # `precision=` or a quoted "precision" (a config key); the look-behind keeps the literal first.
    triggers = (r"precision\s*=", r"precision(?<=[\"']precision)[\"']")
    qualified_prefixes = tuple(sorted(LIGHTNING_TRAINER | LIGHTNING_FABRIC))

    def screen(self, tree) -> bool:
        return precision_may_be(tree, FP16_MIXED)  # a `precision` followed to such a literal

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        for precision, settings, lightning_1 in precision_settings(ctx):
            followed = follow_setting(ctx, precision)
            values = followed.values()
            if not followed.complete or not any(_is_fp16(v) for v in values) or values & set(BF16_VALUES):
                continue
            if chosen_by_hardware(ctx, precision, followed):
                continue
            target = bf16_mixed(lightning_1)
            message = (
                f"`precision={_shown(followed)}` trains in float16 with a GradScaler"
                f"{describe_sources(ctx, followed, _is_fp16)}; on {AMPERE} use `precision={target!r}`: "
                "bfloat16 has float32's range and needs no scaler"
            )
            reason = None
            backend = setting_named(settings, "amp_backend")
            if backend is not None and literal_value(backend.value) != "native":
                reason = "bf16 does not run on the apex backend (`amp_backend`)"
            elif setting_named(settings, "plugins") is not None:
                reason = "`plugins=` may hold a precision plugin or GradScaler that bf16-mixed rejects"
            edits = []
            if reason is None:
                edits, reason = respell_sources(ctx, followed, _is_fp16, target)
            if reason is not None:
                ctx.report(precision.anchor, message, no_fix_reason=reason)
                continue
            fix = ctx.fix(f"Use `precision={target!r}`")
            for node, new in edits:
                fix.replace(node, new)
            ctx.report(precision.anchor, message, fix=fix.build())


def _shown(followed) -> str:
    value = next(v for v in followed.values() if _is_fp16(v))
    return repr(value)
