"""AMP201: `torch.cuda.amp.autocast` / `torch.cpu.amp.autocast` -> `torch.amp.autocast(device, ...)`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, misplaced_device_message, legacy_spelling, modern_spelling


class LegacyAutocast(SiteRule):
    code = "AMP201"

    @staticmethod
    def message(site: Site) -> str:
        if site.misplaced_device is not None:
            return misplaced_device_message(site, "enabled")
        return (
            f"`{legacy_spelling(site.api)}` is deprecated (FutureWarning since torch 2.4); "
            f"use `{modern_spelling(site.api)}` with the device explicit"
        )
