"""A text pre-filter that skips files which cannot hold a finding before anything is parsed.

Each rule declares `triggers`: regular expressions of which at least one matches the source of
any file where the rule can report (a test runs every fixture with and without the filter to
prove it drops no finding). Most files of a large tree match none and cost one regex scan.
"""

from __future__ import annotations

import re
from typing import List, Sequence

from ampmigrate.rules.base import Rule


class Prefilter:
    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._patterns = [re.compile("|".join(f"(?:{t})" for t in rule.triggers)) for rule in self.rules]
        union = "|".join(f"(?:{t})" for rule in self.rules for t in rule.triggers)
        self._any = re.compile(union) if union else None

    def rules_for(self, text: str) -> List[Rule]:
        """The rules that could report on `text`."""
        if self._any is None or not self._any.search(text):
            return []
        return [rule for rule, pattern in zip(self.rules, self._patterns) if pattern.search(text)]
