"""`check --statistics` (findings per rule) and `fix --show-fixes` (fixes applied per file)."""

from __future__ import annotations

from collections import Counter

from ampmigrate.output import Report, fix_marker, summary


def statistics(report: Report) -> str:
    """`count  CODE  [*] name` per rule, most frequent first (ruff's `--statistics`)."""
    from ampmigrate.catalogue import load_catalogue

    docs = load_catalogue()
    counts = Counter(f.code for f in report.findings)
    fixable = {f.code for f in report.findings if fix_marker(f, report.unsafe_fixes)}
    width = len(str(max(counts.values()))) if counts else 1
    lines = [
        f"{count:>{width}}\t{code}\t{'[*]' if code in fixable else '[ ]'} {docs[code].name if code in docs else ''}".rstrip()
        for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]
    return "\n".join([*lines, summary(report)]) + "\n"


def show_fixes(result) -> str:
    """The fixes a `fix` run applied: per file, how many findings of each rule."""
    lines = []
    for outcome in result.results:
        if outcome.new_text is None or not outcome.fixed:
            continue
        lines.append(f"{outcome.path}:")
        for code, count in sorted(outcome.fixed_codes.items()):
            lines.append(f"    {count} × {code}")
    if not lines:
        return "No fixes applied.\n"
    return "Fixes applied:\n" + "\n".join(lines) + "\n"
