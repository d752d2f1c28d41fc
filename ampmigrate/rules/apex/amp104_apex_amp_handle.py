"""AMP104: the old apex handle API (`amp.init()`, `handle.scale_loss(...)`)."""

from ampmigrate.rules.apex._amp_migration import Site
from ampmigrate.rules.apex._amp_report import AmpPlanRule


class ApexAmpHandle(AmpPlanRule):
    code = "AMP104"

    @staticmethod
    def message(site: Site) -> str:
        if site.api == "init":
            return (
                "`amp.init()` is apex.amp's old handle API (removed with apex.amp in May 2025); use "
                '`torch.amp.GradScaler("cuda")` and `torch.autocast("cuda", dtype=torch.float16)`'
            )
        return (
            f"`{site.api}` of apex.amp's old handle API (removed in May 2025) no longer runs; use "
            "`scaler.scale(loss).backward()`"
        )
