"""AMP202: `torch.cuda.amp.GradScaler` / `torch.cpu.amp.GradScaler` -> `torch.amp.GradScaler(device, ...)`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, legacy_spelling, modern_spelling


class LegacyGradScaler(SiteRule):
    code = "AMP202"

    @staticmethod
    def message(site: Site) -> str:
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}` (positional arguments become keywords: the device comes first)"
        )
