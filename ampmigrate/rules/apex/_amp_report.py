"""Reporting the sites of the shared apex.amp plan under the rule each belongs to."""

from __future__ import annotations

from typing import Callable

from ampmigrate.rules.apex._amp_migration import Site, amp_plan


def report_amp_sites(ctx, message: Callable[[Site], str]) -> None:
    plan = amp_plan(ctx.file)
    for site in plan.sites:
        if site.code == ctx.rule_code:
            ctx.report(site.node, message(site), fix=plan.fix, no_fix_reason=None if plan.fix else plan.reason)
