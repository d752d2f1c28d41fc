"""The contract between the engine and a rule.

A rule is a class with a `code` (its catalogue entry, `rules/<code>.toml`, holds its name, docs
and fix safety), `triggers` (regular expressions; a file that matches none of them cannot hold a
finding of this rule and is never parsed for it), optionally `qualified_prefixes` (see below),
and `check(ctx)`, which reports findings through `ctx.report(...)`. Rules look at the module
through `ctx.names` (the shared name/scope pass) rather than walking the tree themselves where
they can.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar, Optional, Tuple

from ampmigrate.catalogue import RuleDoc, rule_doc

if TYPE_CHECKING:
    from ampmigrate.config import Settings
    from ampmigrate.engine.context import RuleContext
    from ampmigrate.engine.project_index import ProjectIndex


class Rule:
    code: ClassVar[str]
    triggers: ClassVar[Tuple[str, ...]]
    # Qualified-name prefixes (`"torch.cuda.amp"`) such that the rule reports only in files where
    # the name resolver gives some import or expression one of these names or a name under one
    # (`torch.cuda.amp.autocast`). Files that reach none are screened out with `ast` before
    # LibCST parses them (engine/prescreen.py). None: the rule cannot say (it also reports on
    # code that resolves to nothing, such as `x.half()`); the file is parsed whenever a trigger
    # matches.
    qualified_prefixes: ClassVar[Optional[Tuple[str, ...]]] = None
    # Regular expressions that must all match too, besides one of the triggers: for a rule that
    # needs two things in one file (a float16 conversion *and* a training use).
    requires: ClassVar[Tuple[str, ...]] = ()

    def screen(self, tree: ast.Module) -> bool:
        """False only where `check` cannot report on the file that `ast` parsed as `tree`.

        Run before LibCST parses the file, for the files the triggers let through; it must
        over-approximate `check` (tests/test_prescreen.py compares findings with and without
        it). The default keeps every file; a rule overrides it where the shape it reports on
        is cheap to rule out and its triggers are common words."""
        return True

    def applies_to(self, path: str, settings: "Settings") -> bool:
        """False only where `check` reports nothing on a file at `path` under `settings`, whatever
        the file holds (a precision recommendation in a test file, another target dtype): such a
        file is not searched, screened or parsed for the rule. Must agree with `check`'s own
        early return (tests/test_rule_applicability.py)."""
        return True

    def applies_to_run(self, index: Optional["ProjectIndex"]) -> bool:
        """False only where `check` reports nothing on any file of a run with this project
        index (a rule that reports only through facts the index holds, and the index holds
        none): the rule is left out of the run, so no file is parsed for it."""
        return True

    @classmethod
    def has_screen(cls) -> bool:
        return cls.screen is not Rule.screen

    @property
    def doc(self) -> RuleDoc:
        return rule_doc(self.code)

    def check(self, ctx: "RuleContext") -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.code}>"
