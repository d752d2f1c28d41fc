"""AMP201: `torch.cuda.amp.autocast` / `torch.cpu.amp.autocast` -> `torch.amp.autocast(device, ...)`."""

from ampmigrate.rules.base import Rule
from ampmigrate.rules.legacy_api._migration import LEGACY_PREFIXES, Site, legacy_spelling, modern_spelling, report_sites


class LegacyAutocast(Rule):
    code = "AMP201"
    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        report_sites(ctx, self.message)

    @staticmethod
    def message(site: Site) -> str:
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}` with the device explicit"
        )
