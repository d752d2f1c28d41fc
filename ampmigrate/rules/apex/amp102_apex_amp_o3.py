"""AMP102: `amp.initialize(opt_level="O3")`: pure fp16 training, which torch.amp has no mode for."""

from ampmigrate.rules.apex._amp_migration import Site
from ampmigrate.rules.apex._amp_report import AmpPlanRule


class ApexAmpO3(AmpPlanRule):
    code = "AMP102"

    @staticmethod
    def message(site: Site) -> str:
        return (
            'apex.amp (removed in May 2025) `opt_level="O3"` is pure fp16: the model cast to half, no fp32 master '
            "weights, no loss scaling; torch.amp has no such mode: choose fp16 autocast + GradScaler (O1/O2 "
            "semantics) or bf16, and check convergence"
        )
