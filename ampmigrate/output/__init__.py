"""Output formats for findings: one module per format, each a `render(report) -> str` function."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from ampmigrate.diagnostics import FileError, Finding

FORMATS = ("full", "concise", "json", "github", "sarif")


@dataclass
class Report:
    findings: List[Finding]
    errors: List[FileError] = field(default_factory=list)
    files: int = 0
    unsafe_fixes: bool = False  # whether unsafe fixes count as available


def renderer(name: str):
    """The `render` function of format `name`; only its module is imported (`full` imports rich)."""
    import importlib

    modules: Dict[str, str] = {"full": "full", "concise": "concise", "json": "json_format", "github": "github", "sarif": "sarif"}
    return importlib.import_module(f"ampmigrate.output.{modules[name]}").render


def fix_marker(finding: Finding, unsafe_fixes: bool) -> str:
    """`[*]` when `fix` would apply the finding's fix (ruff's convention)."""
    if finding.fix is None:
        return ""
    if finding.fix.applicability == "safe" or unsafe_fixes:
        return "[*] "
    return ""


def summary(report: Report) -> str:
    failing = [f for f in report.findings if f.fails_run]
    infos = len(report.findings) - len(failing)
    if not report.findings:
        text = "All checks passed!"
    else:
        text = f"Found {len(failing)} finding{'s' if len(failing) != 1 else ''}"
        if infos:
            text += f" (and {infos} informational)"
        text += "."
        safe = sum(1 for f in report.findings if f.fix is not None and f.fix.applicability == "safe")
        unsafe = sum(1 for f in report.findings if f.fix is not None and f.fix.applicability == "unsafe")
        if report.unsafe_fixes:
            safe, unsafe = safe + unsafe, 0
        if safe:
            text += f"\n[*] {safe} fixable with `ampmigrate fix`"
            text += " --unsafe-fixes." if report.unsafe_fixes else "."
        if unsafe:
            text += f"\n{unsafe} more fixable with `ampmigrate fix --unsafe-fixes`."
    if report.errors:
        text += f"\n{len(report.errors)} file{'s' if len(report.errors) != 1 else ''} could not be checked."
    return text
