"""AMP203: `torch.cuda.amp.custom_fwd/custom_bwd` -> `torch.amp.custom_fwd/custom_bwd(device_type="cuda")`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, legacy_spelling, modern_spelling


class LegacyCustomFwdBwd(SiteRule):
    code = "AMP203"

    @staticmethod
    def message(site: Site) -> str:
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}`: the new decorator requires `device_type`"
        )
