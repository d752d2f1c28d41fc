"""AMP402: a GradScaler whose autocast already runs in bfloat16 -> remove the scaler protocol.

The rule fires only when every autocast of the file is known to run in bfloat16, so it never
removes a scaler that fp16 code still needs: with AMP401 the fp16 -> bf16 switch comes first
(round one of `fix`), and this removal follows in the next round, against the switched code.
"""

from __future__ import annotations

from ampmigrate.analysis.autocasts import autocasts
from ampmigrate.analysis.scalers import find_scalers
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import in_inference_code, recommends_bf16_at
from ampmigrate.rules.precision._scaler_removal import disabling_plan, inert_under_bf16, plan_removal
from ampmigrate.api import ANY_GRAD_SCALER


class RedundantGradScaler(Rule):
    code = "AMP402"
    triggers = (r"GradScaler",)
    qualified_prefixes = tuple(sorted(ANY_GRAD_SCALER))

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        scalers = find_scalers(ctx.file)
        if not scalers or not _all_autocasts_bf16(ctx):
            return
        for scaler in scalers:
            if inert_under_bf16(scaler):
                continue  # switched off on purpose, or on only when the run is float16 (off under bf16)
            node = scaler.creations[0].func if scaler.creations else (scaler.uses[0].call if scaler.uses else None)
            if node is None:
                continue
            message = (
                f"`{scaler.display}` scales the loss, but every autocast here runs in bfloat16, which has "
                "float32's exponent range: no gradient underflows, so the scaler only adds an inf check "
                "per step (and can still skip steps)"
            )
            plan = plan_removal(ctx.file, scaler)
            if plan.reason is not None:
                disable = disabling_plan(ctx.file, scaler)
                if disable is None:
                    ctx.report(node, message, no_fix_reason=plan.reason)
                    continue
                fix = ctx.fix(
                    f"Disable `{scaler.display}` (`enabled=False`: each of its calls is then the identity); it is "
                    f"not removed: {plan.reason}"
                )
                for call, disabled in disable:
                    fix.replace(call, disabled)
                ctx.report(node, message, fix=fix.build())
                continue
            fix = plan.apply_to(ctx.fix(f"Remove `{scaler.display}` and its calls (backward and step directly)"))
            ctx.report(node, message, fix=fix.build())


def _all_autocasts_bf16(ctx) -> bool:
    """Some autocast runs in bf16, and none can run in anything but bf16 or float32 (which
    autocast does not lower to: `dtype = torch.bfloat16 if amp else torch.float32`)."""
    seen_bf16 = False
    for autocast in autocasts(ctx.file):
        if autocast.disabled or (autocast.call is not None and in_inference_code(ctx.file, autocast.call)):
            continue  # no gradients there for a scaler to protect
        dtypes = autocast.dtypes(ctx.file)
        if dtypes is None or not dtypes <= {"bfloat16", "float32"}:
            return False
        seen_bf16 = seen_bf16 or "bfloat16" in dtypes
    return seen_bf16
