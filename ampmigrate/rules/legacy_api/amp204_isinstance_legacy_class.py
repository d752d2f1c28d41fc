"""AMP204: `isinstance(x, torch.cuda.amp.GradScaler)` is False for a `torch.amp.GradScaler`."""

from ampmigrate.rules.legacy_api._migration import Site, SiteRule, legacy_spelling


class IsinstanceLegacyClass(SiteRule):
    code = "AMP204"

    @staticmethod
    def message(site: Site) -> str:
        return (
            f"type check against deprecated `{legacy_spelling(site.api)}` is False for objects made by "
            f"`torch.amp.{site.api.modern}`; check against `torch.amp.{site.api.modern}` (which the legacy class subclasses)"
        )
