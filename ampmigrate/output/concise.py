"""`path:row:col: CODE [*] message`, one finding a line (ruff's concise format; in a notebook
`path:cell N:row:col`)."""

from ampmigrate.output import Report, fix_marker


def render(report: Report) -> str:
    lines = [
        f"{f.where}:{f.location.row}:{f.location.column}: {f.code} {fix_marker(f, report.unsafe_fixes)}{f.message}"
        for f in report.findings
    ]
    return "\n".join(lines) + ("\n" if lines else "")
