"""AMP406: Lightning's historical precision aliases (`"bf16"`, and `16` when fp16 is the target)
-> the explicit `"bf16-mixed"` / `"16-mixed"` names of Lightning 2."""

from __future__ import annotations

from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import recommends_bf16
from ampmigrate.rules.precision._frameworks import follow_setting, respell_sources
from ampmigrate.rules.precision._lightning import FP16_ALIASES, precision_settings
from ampmigrate.rules.precision._precision_screen import precision_may_be
from ampmigrate.api import LIGHTNING_FABRIC, LIGHTNING_TRAINER


class LightningPrecisionAlias(Rule):
    code = "AMP406"
    # `precision=` or a quoted "precision" (a config key); the look-behind keeps the literal first.
    triggers = (r"precision\s*=", r"precision(?<=[\"']precision)[\"']")
    qualified_prefixes = tuple(sorted(LIGHTNING_TRAINER | LIGHTNING_FABRIC))

    def screen(self, tree) -> bool:
        return precision_may_be(tree, (*FP16_ALIASES, "bf16"))  # a `precision` followed to an alias

    def check(self, ctx) -> None:
        aliases = {"bf16": "bf16-mixed"}
        if not recommends_bf16(ctx):  # where AMP405 applies, it moves these to "bf16-mixed"
            aliases.update({alias: "16-mixed" for alias in FP16_ALIASES})
        for precision, _settings, lightning_1 in precision_settings(ctx):
            if lightning_1:
                continue  # Lightning 1.x knows only these spellings
            followed = follow_setting(ctx, precision)
            for alias, modern in aliases.items():
                is_alias = lambda v, alias=alias: v == alias and not isinstance(v, bool)  # noqa: E731
                source = next((s for s in followed.sources if is_alias(s.value)), None)
                if source is None:
                    continue
                message = (
                    f"`precision={alias!r}` is a historical alias that Lightning 2 warns about "
                    f'("supported for historical reasons but its usage is discouraged"); write {modern!r}'
                )
                edits, reason = respell_sources(ctx, followed, is_alias, modern)
                if reason is not None:
                    ctx.report(precision.anchor, message, no_fix_reason=reason)
                    continue
                fix = ctx.fix(f"Use `precision={modern!r}`")
                for node, new in edits:
                    fix.replace(node, new)
                ctx.report(precision.anchor, message, fix=fix.build())
