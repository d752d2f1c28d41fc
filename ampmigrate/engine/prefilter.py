"""Which rules could report on a file, decided before the file is parsed with LibCST.

Two sound stages, cheapest first:

1. Text: each rule declares `triggers`, regular expressions of which at least one matches the
   source of any file where the rule can report (and optionally `requires`, regexes that must
   all match as well). Rules share their triggers (the seven apex rules all trigger on
   `\\bapex\\b`), so each distinct regex is searched at most once per file, and only while some
   rule still needs it. (One regex of all the triggers joined by `|` is slower: the engine
   loses the literal-prefix search each of them gets alone. The regexes are compiled by
   engine/fast_regex.py, so that a leading `\\b` does not slow the scan down.)
2. `ast`: for the rules left after stage 1 that declare `qualified_prefixes` (see
   rules/base.py), engine/prescreen.py works out which prefixes the file can reach through its
   imports and attribute chains; rules that reach none are dropped. A rule may also `screen`
   the `ast` itself. The file is parsed with `ast` once, and only if some rule left needs it.
   (Stage 1 already asks, of a rule with prefixes, that the file spell a package they are in.)

Tests run every fixture and a sample of real files with and without this filter and compare
the findings, so a trigger, prefix or screen that is too narrow fails the suite.
"""

from __future__ import annotations

import ast
import re
from typing import AbstractSet, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ampmigrate.engine import collector
from ampmigrate.engine.ast_nodes import release
from ampmigrate.engine.fast_regex import compile_trigger
from ampmigrate.engine.prescreen import QualifiedNameScreen, parse
from ampmigrate.rules.base import Rule


def _requirements(rule: Rule) -> List[str]:
    """The regexes all of which a file matches wherever `rule` can report: its own `requires`,
    and for a rule with `qualified_prefixes`, the name of a package they are in (a qualified
    name starts at an import, which spells it: `transformers` for `transformers.TrainingArguments`)
    and the last part of one of the prefixes (`Trainer` for `lightning.Trainer`).

    The last part: the resolver (engine/names.py) builds a qualified name from what the file
    spells, one identifier per part: an import's dotted module and name (`from lightning
    import Trainer`, `import torch.cuda.amp as a`), an attribute (`pl.Trainer`), a free name a
    star import exports (`Trainer` under `from lightning import *`), an alias assignment of one
    of those, or the same inside a string annotation or a `# type:` comment. A name equal to or
    under a prefix so has each of the prefix's parts spelled somewhere in the text, the last one
    included, as a whole identifier. (Lightning's own tree mentions `precision=` and
    `lightning` in most files, and `Trainer` or `Fabric` in about half of them.)"""
    required = list(rule.requires)
    if rule.qualified_prefixes:
        packages = sorted({prefix.split(".")[0] for prefix in rule.qualified_prefixes})
        required.append(_words(packages))
        lasts = sorted({prefix.rsplit(".", 1)[-1] for prefix in rule.qualified_prefixes})
        if not set(lasts) <= set(packages):  # else the package's regex already asks as much
            required.append(_words(lasts))
    return required


def compile_regexes(rules: Iterable[Rule]) -> None:
    """Compile every regex the pre-filter of `rules` searches (kept by `compile_trigger`)."""
    for rule in rules:
        for pattern in (*rule.triggers, *_requirements(rule)):
            compile_trigger(pattern)


def _words(words: Sequence[str]) -> str:
    """A regex of any of `words` as a whole word; one word is spelled as rules' triggers spell
    it (`\\bapex\\b`), so that a file is searched for it once."""
    if len(words) == 1:
        return r"\b%s\b" % re.escape(words[0])
    return r"\b(?:%s)\b" % "|".join(re.escape(w) for w in words)


class _Regexes:
    """The distinct regexes of one or more pre-filters, and which of them matched the last text
    searched: the pre-filter of a run's rules and that of the rules waiting for the project
    index (engine/pipeline.py) search the same file one after the other, each regex once."""

    def __init__(self) -> None:
        self.compiled: List["re.Pattern[str]"] = []
        self._index: Dict[str, int] = {}
        self._text: Optional[str] = None
        self._found: Dict[int, bool] = {}

    def add(self, pattern: str) -> int:
        if pattern not in self._index:
            self._index[pattern] = len(self.compiled)
            self.compiled.append(compile_trigger(pattern))
        return self._index[pattern]

    def found_in(self, text: str) -> Dict[int, bool]:
        """regex number -> whether it matches `text`, as far as searched (shared while `text`
        is the text last asked about)."""
        if text is not self._text:
            self._text, self._found = text, {}
        return self._found


class Prefilter:
    def __init__(self, rules: Sequence[Rule], shared: Optional["Prefilter"] = None) -> None:
        """`shared`: a pre-filter whose regexes (and their answers for the text last searched)
        this one shares."""
        self.rules = list(rules)
        self._table = shared._table if shared is not None else _Regexes()
        self._regexes = self._table.compiled
        regex = self._table.add

        # Per rule: its triggers (any one), and the regexes it requires besides (all). Each is
        # searched alone: a literal at the start of a regex lets the engine skip ahead fast,
        # which `a|b` of two different literals no longer can.
        needs = [(tuple(regex(t) for t in rule.triggers), tuple(regex(r) for r in _requirements(rule))) for rule in self.rules]
        # Per rule: (required regexes shared with other rules, its triggers, its other required
        # regexes), searched in that order (all, any, all: the same answer in any order). A
        # shared one (a package's name) is searched once per file, and where it is missing the
        # rules' own triggers need not be searched at all.
        uses: Dict[int, int] = {}
        for triggers, required in needs:
            for i in {*triggers, *required}:
                uses[i] = uses.get(i, 0) + 1
        self._needs: List[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]] = [
            (tuple(r for r in required if uses[r] > 1), triggers, tuple(r for r in required if uses[r] == 1))
            for triggers, required in needs
        ]
        prefixes = {p for rule in self.rules for p in (rule.qualified_prefixes or ())}
        self._screen: Optional[QualifiedNameScreen] = QualifiedNameScreen(prefixes) if prefixes else None

    def rules_for(
        self, text: str, *, screen: bool = True, skip: AbstractSet[str] = frozenset(), bound: Iterable[str] = ()
    ) -> List[Rule]:
        """The rules that could report on `text` (`screen=False`: by the regexes alone), leaving
        out the codes in `skip` before any regex is searched for them. `bound`: qualified names
        the file's star imports bind to free names (engine/apex_star.py, through the index): a
        rule whose `qualified_prefixes` one of them is under is kept whatever the text spells."""
        reached = self._reached(bound)
        if reached:
            forced = [r for r in self.rules if r.code not in skip and r.qualified_prefixes and reached & set(r.qualified_prefixes)]
            if forced:
                rest = self.rules_for(text, screen=screen, skip=skip | {r.code for r in forced})
                return [r for r in self.rules if r in forced or r in rest]
        found = self._table.found_in(text)

        def matches(i: int) -> bool:
            if i not in found:
                found[i] = self._regexes[i].search(text) is not None
            return found[i]

        rules = [
            rule
            for rule, (shared, triggers, own) in zip(self.rules, self._needs)
            if rule.code not in skip
            and all(matches(r) for r in shared)
            and any(matches(t) for t in triggers)
            and all(matches(r) for r in own)
        ]
        return self._screen_ast(text, rules) if screen and rules else rules

    def _reached(self, bound: Iterable[str]) -> Set[str]:
        """The prefixes (of the rules' `qualified_prefixes`) the qualified names `bound` are under."""
        found: Set[str] = set()
        if self._screen is not None:
            for qname in bound:
                found |= self._screen.hits(qname)
        return found

    def _screen_ast(self, text: str, rules: List[Rule]) -> List[Rule]:
        by_names = self._screen is not None and any(rule.qualified_prefixes is not None for rule in rules)
        if not by_names and not any(rule.has_screen() for rule in rules):
            return rules
        with collector.paused():  # the tree and the screens' walks (engine/collector.py)
            tree = parse(text)
            if tree is None:  # `ast` cannot parse it: let LibCST decide (and report)
                return rules
            reachable = None
            if by_names and self._screen is not None:
                needed = [frozenset(rule.qualified_prefixes) for rule in rules if rule.qualified_prefixes is not None]
                reachable = self._screen.reachable_in(tree, text, needed)
            kept = [rule for rule in rules if self._may_report(rule, tree, reachable)]
            # The tree goes before the collector runs again: freed, not walked by a collection.
            del tree
            release()
        return kept

    @staticmethod
    def _may_report(rule: Rule, tree: ast.Module, reachable) -> bool:
        if rule.qualified_prefixes is not None and reachable is not None:
            if reachable.isdisjoint(rule.qualified_prefixes):
                return False
        if not rule.has_screen():
            return True
        try:
            return rule.screen(tree)
        except RecursionError:  # a tree too deep to walk: let LibCST decide
            return True
