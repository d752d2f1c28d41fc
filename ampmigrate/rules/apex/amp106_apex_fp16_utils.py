"""AMP106: apex.fp16_utils (FP16_Optimizer, network_to_half, ...), removed in May 2025, and the
FP16_Optimizer apex.contrib still ships (the same recipe, which torch.amp replaces).

Besides the names themselves, `optimizer.backward(loss)` on an FP16_Optimizer (a local or a
`self.` attribute assigned one in this file) is reported: it is the scaled backward the migration
has to replace, often in another method than the wrapper's construction.
"""

import libcst as cst

from ampmigrate.api import APEX_CONTRIB_FP16_OPTIMIZERS, APEX_FP16_UTILS
from ampmigrate.rules.apex._class_migration import ClassSite, Mapping, report_class_sites
from ampmigrate.rules.base import Rule

_REASON = (
    "apex.fp16_utils trains an fp16 model with fp32 master weights (apex O2 with manual loss scaling); the "
    "torch.amp recipe keeps the model in fp32 under `torch.autocast(\"cuda\", dtype=torch.float16)`, so the "
    "`.half()` casts of the model and its inputs go too: migrate by hand (see AMP101's recipe)"
)
_WHAT = {
    "FP16_Optimizer": "use the wrapped optimizer with `torch.amp.GradScaler(\"cuda\")`: `optimizer.backward(loss)` "
    "becomes `scaler.scale(loss).backward()`, `optimizer.step()` `scaler.step(optimizer)` + `scaler.update()`, "
    "`clip_master_grads(n)` `scaler.unscale_(optimizer)` + `torch.nn.utils.clip_grad_norm_`",
    "network_to_half": "keep the model in fp32 and run the forward pass under `torch.autocast(\"cuda\", dtype=torch.float16)`",
    "BN_convert_float": "keep the model in fp32 (autocast keeps batchnorm in fp32)",
    "FP16Model": "keep the model in fp32 and run the forward pass under `torch.autocast`",
    "convert_network": "keep the model in fp32 and run the forward pass under `torch.autocast`",
    "convert_module": "keep the model in fp32 and run the forward pass under `torch.autocast`",
    "LossScaler": "use `torch.amp.GradScaler(\"cuda\")`",
    "DynamicLossScaler": "use `torch.amp.GradScaler(\"cuda\")`",
    "to_python_float": "use `tensor.item()`",
    "clip_grad_norm": "use `torch.nn.utils.clip_grad_norm_` after `scaler.unscale_(optimizer)`",
}

_FP16_OPTIMIZERS = frozenset(q for q, short in APEX_FP16_UTILS.items() if short == "FP16_Optimizer")
_CONTRIB = frozenset(APEX_CONTRIB_FP16_OPTIMIZERS)

MAPPINGS = {
    qname: Mapping("AMP106", None, (0, 0), None, reason=_REASON) for qname in (*APEX_FP16_UTILS, *_CONTRIB)
}


class ApexFp16Utils(Rule):
    code = "AMP106"
    triggers = (r"\bapex\b",)  # every use resolves through an import that names apex
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_class_sites(ctx, MAPPINGS, "fp16_utils", self.message)
        for call in ctx.names.nodes_of_type(cst.Call):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "backward" and call.args):
                continue
            classes = ctx.names.instance_classes(func.value)
            if classes & _FP16_OPTIMIZERS:
                what = "apex FP16_Optimizer's scaled backward, removed with apex.fp16_utils in May 2025"
            elif classes & _CONTRIB:
                what = "the scaled backward of apex.contrib's FP16_Optimizer, apex's legacy fp16 recipe"
            else:
                continue
            ctx.report(func, f"`{ctx.code(func).strip()}(...)` is {what}; " + _WHAT["FP16_Optimizer"], no_fix_reason=_REASON)

    @staticmethod
    def message(site: ClassSite) -> str:
        instead = _WHAT.get(site.short, "use torch.amp (autocast and GradScaler)")
        if site.qname in _CONTRIB:
            return (
                "`apex.contrib.optimizers.FP16_Optimizer` is apex's legacy fp16 recipe (an fp16 model, fp32 master "
                f"weights, manual loss scaling), which torch.amp replaces; {instead}"
            )
        return f"`apex.fp16_utils.{site.short}` was removed from apex in May 2025, so this no longer runs; {instead}"
