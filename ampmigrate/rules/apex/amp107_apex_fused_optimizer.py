"""AMP107: apex's FusedAdam / FusedSGD -> `torch.optim.AdamW|Adam|SGD(..., fused=True)`."""

from ampmigrate.api import APEX_OPTIMIZERS, TORCH_FUSED_ADAMW_SINCE, TORCH_FUSED_SGD_SINCE
from ampmigrate.rules.apex._class_migration import CallArgs, ClassSite, Converted, Mapping, Unconvertible, report_class_sites
from ampmigrate.rules.base import Rule


def fused_adam(call: CallArgs) -> Converted:
    call.require("bias_correction", (True,), "`bias_correction=False` has no torch.optim equivalent")
    call.require("amsgrad", (False,), "apex FusedAdam does not support `amsgrad`")
    call.require("master_weights", (False,), "`master_weights=True` has no torch.optim equivalent")
    mode = call.literal("adam_w_mode", True)
    if mode not in (True, False):
        raise Unconvertible("`adam_w_mode` is only known at run time, and it chooses between Adam and AdamW")
    target = "torch.optim.AdamW" if mode else "torch.optim.Adam"
    args = call.keep(("params", "lr", "betas", "eps", "weight_decay", "capturable"), positional_prefix=2)
    note = None
    if mode and not call.has("weight_decay"):
        # apex defaults to 0.0, torch.optim.AdamW to 0.01.
        args.append(call.keyword("weight_decay", "0.0"))
        note = "`weight_decay=0.0` made explicit: torch.optim.AdamW defaults to 0.01"
    args.append(call.keyword("fused", "True"))
    return Converted(target, args, note=note)


fused_adam.params = ("params", "lr", "bias_correction", "betas", "eps", "adam_w_mode", "weight_decay",
                     "amsgrad", "set_grad_none", "capturable", "master_weights")


def fused_sgd(call: CallArgs) -> Converted:
    call.require("wd_after_momentum", (False,), "`wd_after_momentum=True` has no torch.optim equivalent")
    args = call.keep(("params", "lr", "momentum", "dampening", "weight_decay", "nesterov"), positional_prefix=6)
    args.append(call.keyword("fused", "True"))
    return Converted("torch.optim.SGD", args)


fused_sgd.params = ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov", "wd_after_momentum",
                    "materialize_master_grads", "set_grad_none")

MAPPINGS = {}
for qname, short in APEX_OPTIMIZERS.items():
    if short == "FusedAdam":
        MAPPINGS[qname] = Mapping("AMP107", None, TORCH_FUSED_ADAMW_SINCE, fused_adam)
    elif short == "FusedSGD":
        MAPPINGS[qname] = Mapping("AMP107", "torch.optim.SGD", TORCH_FUSED_SGD_SINCE, fused_sgd)


class ApexFusedOptimizer(Rule):
    code = "AMP107"
    triggers = (r"FusedAdam|FusedSGD",)  # the class name appears wherever it is imported or used
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_class_sites(ctx, MAPPINGS, "optimizers", self.message, self.import_message)

    @staticmethod
    def import_message(short: str) -> str:
        return f"imports apex's `{short}`, which needs apex's CUDA extensions; torch.optim has the same fused kernel"

    @staticmethod
    def message(site: ClassSite) -> str:
        torch = "torch.optim.AdamW(..., fused=True)" if site.short == "FusedAdam" else "torch.optim.SGD(..., fused=True)"
        return f"apex's `{site.short}` needs apex's CUDA extensions; `{torch}` is the same fused kernel in torch"
