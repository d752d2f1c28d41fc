"""AMP404: `TrainingArguments` precision arguments that transformers 5 removed -> drop them."""

from __future__ import annotations

from ampmigrate.api import HF_TRAINING_ARGUMENTS
from ampmigrate.diagnostics import SAFE, UNSAFE
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._frameworks import framework_calls, removal_changes, settings_of
from ampmigrate.rules.precision.amp403_hf_fp16_training_args import uses_apex_backend

REMOVED = {
    "fp16_opt_level": "it only configured apex AMP",
    "half_precision_backend": "native AMP is the only backend left",
    "fp16_backend": "it was the deprecated alias of `half_precision_backend`",
}


class HfRemovedPrecisionArgs(Rule):
    code = "AMP404"
    triggers = ("fp16_opt_level", "half_precision_backend", "fp16_backend")
    qualified_prefixes = tuple(sorted(HF_TRAINING_ARGUMENTS))

    def check(self, ctx) -> None:
        for _ref, call in framework_calls(ctx, HF_TRAINING_ARGUMENTS):
            settings = settings_of(ctx, call)
            removed = [s for s in settings if s.name in REMOVED]
            if not removed:
                continue
            apex = uses_apex_backend(ctx, settings)
            changes = removal_changes(ctx, removed)
            fix = None
            if changes is not None:
                names = ", ".join(f"`{s.name}`" for s in removed)
                builder = ctx.fix(f"Remove {names}", applicability=UNSAFE if apex else SAFE)
                for container, new in changes:
                    builder.replace(container, new)
                fix = builder.build()
            for setting in removed:
                message = (
                    f"`{setting.name}` was removed in transformers 5, where passing it raises TypeError; "
                    f"{REMOVED[setting.name]}"
                    + (" (removing it moves training off apex onto native AMP)" if apex else "")
                )
                ctx.report(
                    setting.anchor, message, fix=fix, no_fix_reason=None if fix else "the arguments sit in nested dicts"
                )
