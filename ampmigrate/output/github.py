"""GitHub Actions workflow commands: `::error file=...,line=...,col=...,title=...::message`."""

from ampmigrate.output import Report

_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(report: Report) -> str:
    lines = []
    for f in report.findings:
        properties = ",".join(
            [
                f"title={escape_property(f'ampmigrate ({f.code})')}",
                f"file={escape_property(f.path)}",
                f"line={f.location.row}",
                f"col={f.location.column}",
                f"endLine={f.end_location.row}",
                f"endColumn={f.end_location.column}",
            ]
        )
        message = f"{f.path}:{f.location.row}:{f.location.column}: {f.code} {f.message}"
        lines.append(f"::{_LEVEL.get(f.severity, 'error')} {properties}::{escape_data(message)}")
    for error in report.errors:
        lines.append(f"::error {f'file={escape_property(error.path)}'}::{escape_data(str(error))}")
    return "\n".join(lines) + ("\n" if lines else "")
