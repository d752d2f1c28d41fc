"""One file, start to end: pre-filter -> parse -> name pass -> rules -> findings -> fixes.

`Engine.check_text` reports; `Engine.fix_text` applies fixes round after round (each round
re-parses and re-runs every rule on the new text) until no applicable fix is left, and never
returns text that fails to parse.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.config import Settings
from ampmigrate.diagnostics import UNSAFE, FileError, Finding, Fix, Location
from ampmigrate.engine import collector, fixer, prescreen
from ampmigrate.engine.context import FileContext, RuleContext
from ampmigrate.engine.noqa import file_suppressions, parse_suppressions
from ampmigrate.engine.fast_regex import compile_trigger
from ampmigrate.engine.prefilter import Prefilter
from ampmigrate.engine.apex_star import candidate_names as star_names
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.write_check import why_not_written
from ampmigrate.engine.results import TOO_DEEP, FileResult  # noqa: F401 (FileResult: re-exported)
from ampmigrate.rules import all_rules, rule_classes
from ampmigrate.rules.base import Rule
from ampmigrate.rules.meta.amp001_unused_noqa import UnusedNoqa
from ampmigrate.source import split_lines

MAX_ROUNDS = 25
# `from m import *` (any spacing, continuations): names the index may bind (engine/apex_star.py).
# (compile_trigger: a leading `\b` makes the engine scan every character, 0.07 s on Lightning.)
_STAR_IMPORT = compile_trigger(r"\bimport[ \t\\\r\n]*\*")
UNSPLICEABLE = (
    "cannot fix: libcst does not reproduce this file byte for byte next to the code to change; "
    "file left unchanged"
)


@dataclass
class _Analysis:
    text: str
    module: cst.Module
    context: FileContext
    findings: List[Finding]
    fixes: List[Fix]  # applicable under the current settings, in source order
    members: Dict[Fix, List[Finding]]
    _rendered: Optional[str] = None

    def apply(self, fixes: Sequence[Fix]) -> Optional[str]:
        """The text with `fixes` applied, or None where libcst cannot carry the change over."""
        if self._rendered is None:
            self._rendered = self.module.code
        return fixer.splice(self.text, self._rendered, fixer.apply_fixes(self.module, fixes))


class Engine:
    def __init__(
        self,
        settings: Settings,
        rules: Optional[Sequence[Rule]] = None,
        project: Optional[ProjectImports] = None,
        *,
        prefilter: bool = True,
        index: Optional[ProjectIndex] = None,
        index_pending: bool = False,
    ) -> None:
        self.settings = settings
        # What the other files of the run do (engine/project_index.py), built before any rule runs.
        self.index = index
        # What other files import from each module; fixes of such names are withheld (see project.py).
        self.project = project
        candidates = list(rules) if rules is not None else all_rules()
        self.enabled: Set[str] = set(settings.enabled_codes(r.code for r in candidates))
        self.rules = [r for r in candidates if r.code in self.enabled and r.applies_to_run(index)]
        # `index_pending`: the index is being built (engine/runner.py's first round, which only
        # screens; `index` is None). The rules that report only through the index's facts
        # (`applies_to_run(None)` is False) are then only matched by their regexes
        # (`index_rules_match`); the run's process knows later whether any applies.
        self._index_rules: Optional[Prefilter] = None
        # Some enabled rule follows apex names: a star import's may be known only from the index.
        self._star_rules = any("apex" in (r.qualified_prefixes or ()) for r in candidates if r.code in self.enabled)
        # Every rule code there is, for telling an unknown `# noqa: AMP999` from an unselected one.
        self.known_codes = frozenset(cls.code for cls in rule_classes()) | {r.code for r in candidates}
        # prefilter=False parses every file for every rule (tests compare it with the filter).
        self.prefilter: Optional[Prefilter] = Prefilter(self.rules) if prefilter else None
        if index_pending:
            waiting = [r for r in candidates if r.code in self.enabled and not r.applies_to_run(None)]
            # Sharing the run's regexes: a file's text is searched for each distinct one once.
            self._index_rules = Prefilter(waiting, shared=self.prefilter) if waiting else None
        # Called before each LibCST parse (a worker restarts the file's time budget there).
        self.before_parse: Optional[Callable[[], None]] = None

    # ------------------------------------------------------------------ entry points
    # Paused for the whole check (engine/collector.py), so that the tree is freed before the
    # collector runs again rather than walked by the first collection after the analysis.
    @collector.pausing
    def check_text(
        self, text: str, path: str, *, want_edits: bool = False, rules: Optional[Sequence[Rule]] = None
    ) -> FileResult:
        """`rules`: what `rules_for(text)` returned, when the caller has it already."""
        result = FileResult(path)
        rules = self._rules_for(text, path) if rules is None else list(rules)
        if not rules:
            return result
        # unsafe=True: an unsafe fix is still shown (and its edits listed), just not applied.
        analysis = self._analyze(text, path, rules, result, unsafe=True)
        if analysis is None:
            return result
        if want_edits:
            for fix in analysis.fixes:
                fixed = analysis.apply([fix])
                fix.edits = fixer.text_edits(text, fixed) if fixed is not None else ()
        result.findings = analysis.findings
        analysis.context.release()
        return result

    def fix_text(
        self, text: str, path: str, *, unsafe: Optional[bool] = None, rules: Optional[Sequence[Rule]] = None
    ) -> FileResult:
        unsafe = self.settings.unsafe_fixes if unsafe is None else unsafe
        result = FileResult(path)
        rules = self._rules_for(text, path) if rules is None else list(rules)
        if not rules:
            return result
        current = text
        broken: Set[Tuple[str, Tuple[str, ...]]] = set()
        for round_number in range(MAX_ROUNDS):
            round_result = FileResult(path)
            analysis = self._analyze(current, path, rules, round_result, unsafe=unsafe)
            result.errors.extend(e for e in round_result.errors if e not in result.errors)
            result.parsed = True
            if analysis is None:
                break
            # Findings another file's fix of this run resolves (Fix.elsewhere) are fixed as they
            # stand; counted once, from the file as it was (a later round's may be this fix's own
            # result: a guarded load that now needs nothing more).
            resolved = [f for fix in analysis.fixes if fix.elsewhere for f in analysis.members[fix]]
            if round_number == 0:
                for finding in resolved:
                    result.fixed += 1
                    result.fixed_codes[finding.code] = result.fixed_codes.get(finding.code, 0) + 1
            result.findings = [f for f in analysis.findings if not any(f is r for r in resolved)]
            fixes = [f for f in analysis.fixes if not f.elsewhere and fixer.fix_signature(analysis.module, f) not in broken]
            accepted = fixer.select_compatible(fixes, analysis.context.names)
            if not accepted:
                break
            new_text = analysis.apply(accepted)
            if new_text is None:
                result.errors.append(FileError(path, UNSPLICEABLE))
                break
            if self._problem(new_text, current) is not None:
                accepted, new_text = self._isolate_broken(analysis, accepted, current, broken, result)
                if not accepted:
                    continue
            result.fixed += sum(len(analysis.members[f]) for f in accepted)
            for finding in (finding for f in accepted for finding in analysis.members[f]):
                result.fixed_codes[finding.code] = result.fixed_codes.get(finding.code, 0) + 1
            current = new_text
            # The next round may need rules the new text now triggers (e.g. a scaler it added).
            rules = self._rules_for(current, path) or rules
        else:
            result.errors.append(
                FileError(path, f"internal error: fixes did not settle after {MAX_ROUNDS} rounds; file left unchanged")
            )
            return FileResult(path, findings=result.findings, errors=result.errors, parsed=True)
        if current != text:
            result.new_text, result.old_text = current, text
        return result

    def index_rules_match(self, text: str) -> bool:
        """With the index pending: whether the triggers of some rule that reports only through
        the index's facts match `text` (its `ast` screen is left for when the index is here)."""
        if self._star_rules and _STAR_IMPORT.search(text) is not None:
            return True  # its star imports may bind apex's amp module (engine/apex_star.py)
        if self._index_rules is None:
            return False
        return bool(self._index_rules.rules_for(text, screen=False))

    def index_rules_apply(self) -> bool:
        """Whether some enabled rule that reports only through the index's facts applies to
        this run (its index holds such facts), or star imports bind apex names in some file."""
        if self._star_rules and self.index is not None and star_names(self.index):
            return True
        return any(not rule.applies_to_run(None) for rule in self.rules)

    # ------------------------------------------------------------------ internals
    def rules_for(self, text: str, path: Optional[str] = None, *, screen: bool = True) -> List[Rule]:
        """The enabled rules that could report on `text` (the file at `path`): the rules that
        apply to such a path at all (`Rule.applies_to`), then the pre-filter and file-level
        noqa; `screen=False` skips the pre-filter's `ast` stage."""
        return self._rules_for(text, path, screen=screen)

    def _star_bound(self, path: Optional[str]) -> Dict[str, str]:
        """Free names of the file that its star imports of modules of the run bind (the index's
        engine/apex_star.py): {name: qualified name}, for the resolver and the pre-filter."""
        if self.index is None or path is None:
            return {}
        return self.index.star_bound(path)

    def _rules_for(self, text: str, path: Optional[str] = None, *, screen: bool = True) -> List[Rule]:
        skip = self._not_applying(path) if path is not None else frozenset()
        if self.prefilter is not None:
            rules = self.prefilter.rules_for(text, screen=screen, skip=skip, bound=self._star_bound(path).values())
        else:
            rules = [rule for rule in self.rules if rule.code not in skip]
        if rules:
            off = file_suppressions(text)
            if "*" in off:
                return []
            rules = [r for r in rules if r.code not in off]
        return rules

    def _not_applying(self, path: str) -> FrozenSet[str]:
        """Codes of the rules that report nothing on a file at `path` whatever it holds."""
        return frozenset(rule.code for rule in self.rules if not rule.applies_to(path, self.settings))

    def _problem(self, new_text: str, old_text: str) -> Optional[str]:
        """Why the fixed text must not be written, or None (engine/write_check.py)."""
        return why_not_written(new_text, old_text)

    def _isolate_broken(self, analysis, accepted, current, broken, result):
        """A round produced invalid code: keep the first fix that is valid alone, mark the rest."""
        for fix in accepted:
            alone = analysis.apply([fix])
            problem = "produced invalid code" if alone is None else self._problem(alone, current)
            if problem is None:
                return [fix], alone
            broken.add(fixer.fix_signature(analysis.module, fix))
            codes = ", ".join(sorted({f.code for f in analysis.members[fix]}))
            result.errors.append(
                FileError(result.path, f"internal error: the {codes} fix ({fix.message}) {problem}; not applied")
            )
        return [], current

    @collector.pausing  # one round: parse, name pass, rules (engine/collector.py)
    def _analyze(
        self,
        text: str,
        path: str,
        rules: Sequence[Rule],
        result: FileResult,
        *,
        unsafe: bool = False,
    ) -> Optional[_Analysis]:
        # What CPython's own parser rejects never reaches LibCST, whose native parser can crash
        # on it (thousands of nested brackets) or take minutes.
        rejected = python_rejects(text)
        if rejected is not None:
            result.errors.append(FileError(path, rejected))
            return None
        if self.before_parse is not None:
            self.before_parse()
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            result.errors.append(FileError(path, _syntax_error(exc)))
            return None
        except RecursionError:
            result.errors.append(FileError(path, TOO_DEEP))
            return None
        result.parsed = True
        try:
            context = FileContext(path, text, module, self.settings, self._star_bound(path))
        except RecursionError:  # the name pass walks the tree recursively
            result.errors.append(FileError(path, TOO_DEEP))
            return None
        if self.project is not None:
            context.imported_elsewhere = self.project.imported_from(path)
            context.imports_scanned = True
        context.project_index = self.index
        for rule in rules:
            try:
                rule.check(RuleContext(context, rule))
            except Exception as exc:  # a rule bug must not stop the run
                result.errors.append(
                    FileError(path, f"internal error in {rule.code}: {type(exc).__name__}: {exc}")
                )
        findings: List[Finding] = []
        members: Dict[Fix, List[Finding]] = {}
        blocked: Set[Fix] = set()
        if context.reports or self._noqa_rule(rules) is not None:
            suppressions = parse_suppressions(text)
            lines = split_lines(text)
            used: Set[Tuple[int, str]] = set()  # (row, code) of line-level noqa that hid a finding

            def take(reports) -> None:
                for report in reports:
                    position = context.position(report.node)
                    row = position.start.line
                    if report.code not in self.enabled:
                        continue
                    if suppressions.suppresses(report.code, row) or not self.settings.enabled_in(report.code, path):
                        if suppressions.line_suppresses(report.code, row):
                            used.add((row, report.code))
                        if report.fix is not None:
                            blocked.add(report.fix)  # part of this fix is suppressed
                        continue
                    finding = Finding(
                        code=report.code,
                        message=report.message,
                        path=path,
                        location=Location(row, position.start.column + 1),
                        end_location=Location(position.end.line, position.end.column + 1),
                        severity=report.severity,
                        fix=report.fix,
                        no_fix_reason=report.no_fix_reason,
                        noqa_row=row,
                        source_line=lines[row - 1] if row - 1 < len(lines) else "",
                    )
                    findings.append(finding)
                    if report.fix is not None:
                        members.setdefault(report.fix, []).append(finding)

            take(context.reports)
            noqa_rule = self._noqa_rule(rules)
            if noqa_rule is not None:
                before = len(context.reports)
                noqa_rule.report_suppressions(
                    RuleContext(context, noqa_rule),
                    used,
                    self.known_codes,
                    lambda code: code in self.enabled
                    and self.settings.enabled_in(code, path)
                    and not suppressions.file_suppresses(code),
                )
                take(context.reports[before:])
        findings.sort(key=Finding.sort_key)
        fixes: List[Fix] = []
        for fix, group in sorted(members.items(), key=lambda item: min(f.sort_key() for f in item[1])):
            reason = self._why_not_applicable(fix, blocked, unsafe)
            if reason is None:
                fixes.append(fix)
            elif reason != "unsafe":
                for finding in group:
                    finding.fix = None
                    finding.no_fix_reason = reason
        return _Analysis(text, module, context, findings, fixes, members)

    def _noqa_rule(self, rules: Sequence[Rule]) -> Optional[UnusedNoqa]:
        return next((rule for rule in rules if isinstance(rule, UnusedNoqa)), None)

    def _why_not_applicable(self, fix: Fix, blocked: Set[Fix], unsafe: bool) -> Optional[str]:
        if fix in blocked:
            return "part of this fix is suppressed by a noqa comment"
        missing = sorted(fix.requires - self.enabled)
        if missing:
            return f"the fix also changes code reported by {', '.join(missing)}, which is not selected"
        if fix.applicability == UNSAFE and not unsafe:
            return "unsafe"
        return None


def python_rejects(text: str) -> Optional[str]:
    """The one-line error for a text `ast` cannot parse, else None (no second parse of a text
    the pre-filter's screen has just parsed)."""
    if prescreen.parsed_last(text):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not ours to show
            ast.parse(text)
    except SyntaxError as python:  # also IndentationError and TabError
        where = f" at {python.lineno}:{python.offset}" if python.lineno else ""
        return f"syntax error{where}: {python.msg}"
    except (RecursionError, MemoryError):
        return TOO_DEEP
    except ValueError as exc:  # e.g. a NUL byte, which SourceFile refuses before this
        return f"syntax error: {exc}"
    return None


def _syntax_error(exc: cst.ParserSyntaxError) -> str:
    """One line for a file libcst cannot parse (though CPython's parser accepts it)."""
    detail = str(exc.message).strip().splitlines()[0] if exc.message else "invalid syntax"
    return f"cannot parse at {exc.raw_line}:{exc.raw_column + 1} (libcst: {detail})"
