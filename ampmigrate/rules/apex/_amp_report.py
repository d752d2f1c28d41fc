"""Reporting the sites of the shared apex.amp plan under the rule each belongs to."""

from __future__ import annotations

from typing import Callable

from ampmigrate.rules.apex._amp_migration import Site, amp_plan
from ampmigrate.rules.base import Rule


class AmpPlanRule(Rule):
    """A rule that reports its share of the apex.amp plan's sites (AMP101-AMP104); each says
    what a site means in its `message`."""

    triggers = (r"\bapex\b",)  # every use resolves through an import that names apex
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_amp_sites(ctx, self.message)

    @staticmethod
    def message(site: Site) -> str:  # pragma: no cover - interface
        raise NotImplementedError


def report_amp_sites(ctx, message: Callable[[Site], str]) -> None:
    plan = amp_plan(ctx.file)
    for site in plan.sites:
        if site.code == ctx.rule_code:
            ctx.report(site.node, message(site), fix=plan.fix, no_fix_reason=None if plan.fix else plan.reason)
