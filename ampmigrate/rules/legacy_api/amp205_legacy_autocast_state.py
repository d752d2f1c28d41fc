"""AMP205: device-specific autocast state functions -> the `torch.*_autocast_*(device, ...)` ones."""

import libcst as cst

from ampmigrate.api import LEGACY_AUTOCAST_STATE, format_version
from ampmigrate.engine.context import rebuild_args
from ampmigrate.rules.base import Rule


class LegacyAutocastState(Rule):
    code = "AMP205"
    triggers = (r"autocast_(?:gpu|cpu)_dtype|autocast_cpu_enabled",)
    qualified_prefixes = tuple(sorted(LEGACY_AUTOCAST_STATE))

    def check(self, ctx) -> None:
        for ref, qnames in ctx.names.find(LEGACY_AUTOCAST_STATE):
            qname = next(iter(qnames))
            api = LEGACY_AUTOCAST_STATE[qname]
            if ctx.settings.min_torch < api.since:
                continue  # the only spelling the oldest supported torch has
            message = (
                f"`{qname}` is deprecated (DeprecationWarning, hidden by default); "
                f"use `torch.{api.modern}({ctx.quote}{api.device}{ctx.quote}, ...)` (torch >= {format_version(api.since)})"
            )
            call = ctx.names.parent(ref)
            torch_node = ref.value if isinstance(ref, cst.Attribute) else None
            if (
                not isinstance(call, cst.Call)
                or call.func is not ref
                or torch_node is None
                or ctx.names.qualified_names(torch_node) != frozenset({"torch"})
            ):
                ctx.report(ref, message, no_fix_reason="only direct `torch.<name>(...)` calls are rewritten")
                continue
            new_call = rebuild_args(call, [cst.Arg(ctx.string(api.device)), *call.args]).with_changes(
                func=ref.with_changes(attr=cst.Name(api.modern))
            )
            fix = ctx.fix(f"Use `torch.{api.modern}({ctx.quote}{api.device}{ctx.quote}, ...)`")
            ctx.report(ref, message, fix=fix.replace(call, new_call).build())
