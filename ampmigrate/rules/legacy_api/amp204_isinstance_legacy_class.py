"""AMP204: `isinstance(x, torch.cuda.amp.GradScaler)` is False for a `torch.amp.GradScaler`."""

from ampmigrate.rules.base import Rule
from ampmigrate.rules.legacy_api._migration import LEGACY_PREFIXES, Site, legacy_spelling, report_sites


class IsinstanceLegacyClass(Rule):
    code = "AMP204"
    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        report_sites(ctx, self.message)

    @staticmethod
    def message(site: Site) -> str:
        return (
            f"type check against deprecated `{legacy_spelling(site.api)}` is False for objects made by "
            f"`torch.amp.{site.api.modern}`; check against `torch.amp.{site.api.modern}` (which the legacy class subclasses)"
        )
