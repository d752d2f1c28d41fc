"""AMP206: legacy API kept behind a torch version check (informational, never fixed)."""

from ampmigrate.rules.base import Rule
from ampmigrate.rules.legacy_api._migration import LEGACY_PREFIXES, gated_message, legacy_groups


class VersionGatedLegacyApi(Rule):
    code = "AMP206"
    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        min_torch = ctx.settings.min_torch
        for group in legacy_groups(ctx.file):
            # Below the version that introduced the torch.amp spelling, the gate is still needed.
            if group.gate is None or not group.sites or group.min_since > min_torch:
                continue
            ctx.report(group.sites[0].ref, gated_message(group, min_torch), no_fix_reason=group.reason)
