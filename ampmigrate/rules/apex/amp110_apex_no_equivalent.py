"""AMP110: apex features that torch has no counterpart for (FusedLAMB, multi_tensor_applier, ...)."""

from ampmigrate.api import APEX_MULTI_TENSOR, APEX_OPTIMIZERS
from ampmigrate.rules.apex._class_migration import ClassSite, Mapping, report_class_sites
from ampmigrate.rules.base import Rule

_WHY = {
    "FusedLAMB": "torch.optim has no LAMB",
    "FusedMixedPrecisionLamb": "torch.optim has no LAMB",
    "FusedNovoGrad": "torch.optim has no NovoGrad",
    "FusedAdagrad": "apex's `adagrad_w_mode` has no torch.optim.Adagrad argument",
    "multi_tensor_applier": "it drives apex's own CUDA kernels (amp_C); torch's `torch._foreach_*` ops are the closest",
}

MAPPINGS = {}
for table in (APEX_OPTIMIZERS, APEX_MULTI_TENSOR):
    for qname, short in table.items():
        if short in _WHY:
            MAPPINGS[qname] = Mapping("AMP110", None, (0, 0), None, reason=_WHY[short])


class ApexNoTorchEquivalent(Rule):
    code = "AMP110"
    triggers = (r"Fused(?:LAMB|MixedPrecisionLamb|NovoGrad|Adagrad)", "multi_tensor_applier")
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_class_sites(ctx, MAPPINGS, "no-equivalent", self.message)

    @staticmethod
    def message(site: ClassSite) -> str:
        return (
            f"apex's `{site.short}` has no torch counterpart ({_WHY[site.short]}); it still needs apex's CUDA "
            "extensions (apex.optimizers and apex.multi_tensor_apply are still shipped)"
        )
