"""AMP202: `torch.cuda.amp.GradScaler` / `torch.cpu.amp.GradScaler` -> `torch.amp.GradScaler(device, ...)`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, misplaced_device_message, legacy_spelling, modern_spelling


class LegacyGradScaler(SiteRule):
    code = "AMP202"

    @staticmethod
    def message(site: Site) -> str:
        if site.misplaced_device is not None:
            return misplaced_device_message(site, "init_scale")
        if site.usage == "base":
            return (
                f"a subclass of `{legacy_spelling(site.api)}`, which is deprecated (FutureWarning at every construction "
                f"since torch 2.4); subclass `torch.amp.GradScaler` (its `__init__` takes the device first, "
                f"defaulting to \"cuda\")"
            )
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}` (positional arguments become keywords: the device comes first)"
        )
