"""AMP103: `amp.initialize(opt_level="O0")`: fp32 training through apex.amp; drop apex."""

from ampmigrate.rules.apex._amp_migration import Site
from ampmigrate.rules.apex._amp_report import AmpPlanRule


class ApexAmpO0(AmpPlanRule):
    code = "AMP103"

    @staticmethod
    def message(site: Site) -> str:
        return (
            'apex.amp (removed in May 2025) with `opt_level="O0"` is plain fp32 training; remove apex.amp '
            "(the backward pass needs no loss scaling)"
        )
