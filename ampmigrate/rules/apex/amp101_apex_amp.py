"""AMP101: apex.amp (O1/O2) -> `torch.autocast("cuda", dtype=torch.float16)` + `torch.amp.GradScaler`."""

from ampmigrate.rules.apex._amp_migration import Site
from ampmigrate.rules.apex._amp_report import AmpPlanRule

_REPLACEMENT = {
    "initialize": '`torch.amp.GradScaler("cuda")` and `torch.autocast("cuda", dtype=torch.float16)` around the forward pass',
    "scale_loss": "`scaler.scale(loss).backward()`, then `scaler.step(optimizer)` and `scaler.update()`",
    "master_params": "the optimizer's own parameters, after `scaler.unscale_(optimizer)`",
    "state_dict": "`scaler.state_dict()`",
    "load_state_dict": "`scaler.load_state_dict(...)`",
    "disable_casts": '`torch.autocast("cuda", enabled=False)`',
    "_amp_state": "`scaler.get_scale()`",
    "import": "`torch.autocast` and `torch.amp.GradScaler`",
}


class ApexAmp(AmpPlanRule):
    code = "AMP101"

    @staticmethod
    def message(site: Site) -> str:
        what = "apex.amp" if site.api == "import" else f"`amp.{site.api}`"
        instead = _REPLACEMENT.get(site.api, "torch.amp")
        return f"{what} was removed from apex in May 2025, so this no longer runs; use {instead}"
