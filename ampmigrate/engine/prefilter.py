"""Which rules could report on a file, decided before the file is parsed with LibCST.

Two sound stages, cheapest first:

1. Text: each rule declares `triggers`, regular expressions of which at least one matches the
   source of any file where the rule can report. One combined regex rules out most files of a
   large tree with a single scan; the survivors are matched rule by rule. (The regexes are
   compiled by engine/fast_regex.py, so that a leading `\b` does not slow the scan down.)
2. Names: a rule may also declare `qualified_prefixes` (see rules/base.py). For the rules left
   after stage 1 that declare them, `ast` (engine/prescreen.py) works out which prefixes the
   file can reach through its imports and attribute chains; rules that reach none are dropped.
   A rule without `qualified_prefixes` is kept whenever a trigger matched.

Tests run every fixture and a sample of real files with and without this filter and compare
the findings, so a trigger or prefix that is too narrow fails the suite.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ampmigrate.engine.fast_regex import compile_trigger
from ampmigrate.engine.prescreen import QualifiedNameScreen
from ampmigrate.rules.base import Rule


class Prefilter:
    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._patterns = [compile_trigger("|".join(f"(?:{t})" for t in rule.triggers)) for rule in self.rules]
        union = "|".join(f"(?:{t})" for rule in self.rules for t in rule.triggers)
        self._any = compile_trigger(union) if union else None
        prefixes = {p for rule in self.rules for p in (rule.qualified_prefixes or ())}
        self._screen: Optional[QualifiedNameScreen] = QualifiedNameScreen(prefixes) if prefixes else None

    def rules_for(self, text: str, *, screen: bool = True) -> List[Rule]:
        """The rules that could report on `text` (`screen=False`: by the triggers alone)."""
        if self._any is None or not self._any.search(text):
            return []
        rules = [rule for rule, pattern in zip(self.rules, self._patterns) if pattern.search(text)]
        return self._screen_names(text, rules) if screen else rules

    def _screen_names(self, text: str, rules: List[Rule]) -> List[Rule]:
        if self._screen is None or all(rule.qualified_prefixes is None for rule in rules):
            return rules
        reachable = self._screen.reachable(text)
        if reachable is None:  # `ast` cannot parse it: let LibCST decide (and report)
            return rules
        return [
            rule
            for rule in rules
            if rule.qualified_prefixes is None or not reachable.isdisjoint(rule.qualified_prefixes)
        ]
