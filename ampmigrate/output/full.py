"""The default, human format: findings grouped by file, each with its source line and a caret.

Lines are never wrapped here (the terminal wraps at its own width; logs keep whole lines), and a
fix shared by several findings of a file (one migration of a whole file) is described once, under
its first finding.
"""

import io

from rich.console import Console
from rich.text import Text

from ampmigrate.output import Report, fix_marker, summary


def render(report: Report, color: bool = False, width: int = 120) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width, highlight=False, soft_wrap=True)
    current = None
    described = set()  # (path, fix message) already shown
    for f in report.findings:
        if f.path != current:
            if current is not None:
                console.print()
            console.print(Text(f.path, style="bold underline"))
            current = f.path
        header = Text()
        cell = f"cell {f.cell}:" if f.cell is not None else ""
        header.append(f"{cell}{f.location.row}:{f.location.column} ", style="dim")
        header.append(f.code, style="bold red" if f.severity == "error" else "bold yellow" if f.severity == "warning" else "bold blue")
        header.append(" ")
        marker = fix_marker(f, report.unsafe_fixes)
        if marker:
            header.append(marker, style="cyan")
        header.append(f.message)
        console.print(header)
        gutter = str(f.location.row)
        pad = " " * len(gutter)
        line = f.source_line.expandtabs(1)
        width_caret = (
            f.end_location.column - f.location.column
            if f.end_location.row == f.location.row
            else len(line) - f.location.column + 1
        )
        console.print(Text(f"  {pad} |", style="blue"))
        console.print(Text(f"  {gutter} | ", style="blue") + Text(line))
        console.print(
            Text(f"  {pad} | ", style="blue") + Text(" " * (f.location.column - 1) + "^" * max(1, width_caret), style="red")
        )
        if f.fix is not None and (f.path, f.fix.message) not in described:
            described.add((f.path, f.fix.message))
            label = "fix" if f.fix.applicability == "safe" else "unsafe fix"
            console.print(Text(f"  {pad} = {label}: ", style="cyan") + Text(f.fix.message))
        elif f.no_fix_reason:
            console.print(Text(f"  {pad} = no fix: ", style="dim") + Text(f.no_fix_reason))
    if report.findings:
        console.print()
    console.print(Text(summary(report)))
    return buffer.getvalue()
