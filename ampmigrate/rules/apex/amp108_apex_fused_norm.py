"""AMP108: apex's FusedLayerNorm / FusedRMSNorm -> `torch.nn.LayerNorm` / `torch.nn.RMSNorm`."""

from ampmigrate.api import APEX_NORMS, TORCH_RMSNORM_SINCE
from ampmigrate.rules.apex._class_migration import CallArgs, ClassSite, Converted, Mapping, report_class_sites
from ampmigrate.rules.base import Rule

_MIXED = (
    "apex's Mixed* norms keep fp32 parameters and return the input's dtype; the torch module returns "
    "fp32 under autocast"
)


def _norm(target: str, explicit_eps: bool, unsafe=None):
    def convert(call: CallArgs) -> Converted:
        args = call.keep(("normalized_shape", "eps", "elementwise_affine"), positional_prefix=3)
        note = "`memory_efficient` only saved memory; it goes" if call.has("memory_efficient") else None
        if explicit_eps and not call.has("eps"):
            # apex's default is 1e-5; torch.nn.RMSNorm's is torch.finfo(dtype).eps.
            args.append(call.keyword("eps", "1e-5"))
            note = "`eps=1e-5` made explicit: torch.nn.RMSNorm defaults to the dtype's machine epsilon"
        return Converted(target, args, unsafe=unsafe, note=note)

    convert.params = ("normalized_shape", "eps", "elementwise_affine", "memory_efficient")
    return convert


MAPPINGS = {}
for qname, short in APEX_NORMS.items():
    if short == "FusedLayerNorm":
        MAPPINGS[qname] = Mapping("AMP108", "torch.nn.LayerNorm", (1, 0), _norm("torch.nn.LayerNorm", False), value_use_ok=True)
    elif short == "FusedRMSNorm":
        MAPPINGS[qname] = Mapping("AMP108", "torch.nn.RMSNorm", TORCH_RMSNORM_SINCE, _norm("torch.nn.RMSNorm", True))
    elif short == "MixedFusedLayerNorm":
        MAPPINGS[qname] = Mapping("AMP108", "torch.nn.LayerNorm", (1, 0), _norm("torch.nn.LayerNorm", False, _MIXED))
    elif short == "MixedFusedRMSNorm":
        MAPPINGS[qname] = Mapping("AMP108", "torch.nn.RMSNorm", TORCH_RMSNORM_SINCE, _norm("torch.nn.RMSNorm", True, _MIXED))


class ApexFusedNorm(Rule):
    code = "AMP108"
    triggers = (r"Fused(?:LayerNorm|RMSNorm)",)  # the class name appears wherever it is imported
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_class_sites(ctx, MAPPINGS, "norms", self.message, self.import_message)

    @staticmethod
    def import_message(short: str) -> str:
        return f"imports apex's `{short}`, which needs apex's CUDA extensions; torch.nn has fused norm kernels"

    @staticmethod
    def message(site: ClassSite) -> str:
        torch = "torch.nn.RMSNorm" if "RMS" in site.short else "torch.nn.LayerNorm"
        return f"apex's `{site.short}` needs apex's CUDA extensions; `{torch}` has fused kernels in torch"
