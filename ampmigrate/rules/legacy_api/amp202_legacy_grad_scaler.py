"""AMP202: `torch.cuda.amp.GradScaler` / `torch.cpu.amp.GradScaler` -> `torch.amp.GradScaler(device, ...)`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, misplaced_device_message, legacy_spelling, modern_spelling


class LegacyGradScaler(SiteRule):
    code = "AMP202"

    @staticmethod
    def message(site: Site) -> str:
        if site.misplaced_device is not None:
            return misplaced_device_message(site, "init_scale")
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}` (positional arguments become keywords: the device comes first)"
        )
