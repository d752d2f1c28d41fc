"""AMP208: the import of a deprecated `torch.cuda.amp` / `torch.cpu.amp` object or module.

The import line is where a reader (and a grep) sees the legacy API, and where uses the resolver
cannot follow (a name passed on as a value, re-exported) still show. The fix is the one the use
sites share (`_migration`): the import rewrite and every use's device argument, applied once.
An import whose names are all unused is AMP201-AMP203's (reported at each name); one kept behind
a torch version check is AMP206's.
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.api import format_version
from ampmigrate.rules.base import Rule
from ampmigrate.rules.legacy_api._migration import IMPORT_CODE, LEGACY_PREFIXES, Group, legacy_groups


class LegacyAmpImport(Rule):
    code = IMPORT_CODE
    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        min_torch = ctx.settings.min_torch
        for group in legacy_groups(ctx.file):
            if group.statement is None or group.gate is not None:
                continue
            if any(site.usage == "import" for site in group.sites):
                continue  # unused names: reported at each name by their own rule
            if group.sites and all(site.api.since > min_torch for site in group.sites):
                continue  # the legacy spelling is the only one the oldest supported torch has
            fix, reason = group.fix, group.reason
            if fix is not None and group.min_since > min_torch:
                fix = None
                reason = (
                    f"the fix needs torch >= {format_version(group.min_since)}; "
                    f"min-torch is {format_version(min_torch)}"
                )
            ctx.report(group.statement, _message(ctx, group), fix=fix, no_fix_reason=None if fix else reason)


def _message(ctx, group: Group) -> str:
    statement = group.statement
    module = "torch.cuda.amp"
    if isinstance(statement, cst.ImportFrom) and statement.module is not None:
        module = ctx.code(statement.module)
        if module in ("torch.cuda", "torch.cpu"):
            module += ".amp"  # `from torch.cuda import amp`
    elif isinstance(statement, cst.Import):
        module = next((ctx.code(a.name) for a in statement.names if ".amp" in ctx.code(a.name)), module)
    uses = "" if group.sites else " (no use here that the fix can follow)"
    return (
        f"`{module}` is deprecated: its autocast, GradScaler and custom_fwd/custom_bwd warn since torch 2.4; "
        f"import from `torch.amp` and pass the device at each use{uses}"
    )
