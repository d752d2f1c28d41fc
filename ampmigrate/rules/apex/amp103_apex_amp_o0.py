"""AMP103: `amp.initialize(opt_level="O0")`: fp32 training through apex.amp; drop apex."""

from ampmigrate.rules.apex._amp_migration import Site
from ampmigrate.rules.apex._amp_report import report_amp_sites
from ampmigrate.rules.base import Rule


class ApexAmpO0(Rule):
    code = "AMP103"
    triggers = (r"\bapex\b",)  # every use resolves through an import that names apex
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_amp_sites(ctx, self.message)

    @staticmethod
    def message(site: Site) -> str:
        return (
            'apex.amp (removed in May 2025) with `opt_level="O0"` is plain fp32 training; remove apex.amp '
            "(the backward pass needs no loss scaling)"
        )
