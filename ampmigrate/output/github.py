"""GitHub Actions workflow commands: `::error title=...,file=...,line=...,col=...::message`.

Each finding becomes an annotation on the pull request's diff. Property values escape `%`, CR,
LF, `:` and `,`; the message escapes `%`, CR and LF (the rules of GitHub's actions/toolkit).
File paths are relative to the working directory, i.e. the repository root in a workflow.
"""

import os

from ampmigrate.output import Report

_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_path(path: str) -> str:
    """`path` relative to the working directory when it lies inside it, with `/` separators."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return absolute.replace(os.sep, "/")
    return relative.replace(os.sep, "/")


def _command(level: str, properties: dict, message: str) -> str:
    props = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
    return f"::{level} {props}::{escape_data(message)}"


def render(report: Report) -> str:
    lines = []
    for f in report.findings:
        path = workflow_path(f.path)
        properties = {"title": f"ampmigrate ({f.code})", "file": path}
        if f.cell is None:  # a notebook's cell rows are not the file's lines: annotate the file
            properties.update(
                line=f.location.row, col=f.location.column, endLine=f.end_location.row, endColumn=f.end_location.column
            )
        where = path if f.cell is None else f"{path}:cell {f.cell}"
        message = f"{where}:{f.location.row}:{f.location.column}: {f.code} {f.message}"
        lines.append(_command(_LEVEL.get(f.severity, "error"), properties, message))
    for error in report.errors:
        path = workflow_path(error.path)
        lines.append(_command("error", {"title": "ampmigrate (file not checked)", "file": path}, f"{path}: {error.message}"))
    return "\n".join(lines) + ("\n" if lines else "")
