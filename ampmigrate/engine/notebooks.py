"""One notebook through the engine: its code cells as one module, findings back in their cells."""

from __future__ import annotations

import dataclasses
import re
from typing import Set

from ampmigrate.diagnostics import Edit, FileError, Finding, Location
from ampmigrate.engine.pipeline import Engine, FileResult
from ampmigrate.notebook import Notebook, NotebookError

_AT = re.compile(r"\bat (\d+):(\d+)")


def process_notebook(engine: Engine, text: str, path: str, mode: str, *, unsafe: bool = False, want_edits: bool = False) -> FileResult:
    """`check` (mode "check") or `fix` one notebook, whose JSON text is `text`."""
    try:
        notebook = Notebook(text)
    except NotebookError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    if not notebook.is_python or not notebook.python_text:
        return FileResult(path)
    if mode == "check":
        result = engine.check_text(notebook.python_text, path, want_edits=want_edits)
    else:
        result = engine.fix_text(notebook.python_text, path, unsafe=unsafe)
        if result.new_text is not None:
            try:
                new_text = notebook.with_python_text(result.new_text)
            except NotebookError as exc:
                # Report what the notebook has now, and why it was not fixed.
                result = engine.check_text(notebook.python_text, path)
                result.errors.append(FileError(path, str(exc)))
            else:
                result.old_text, result.new_text = (text, new_text) if new_text != text else (None, None)
                notebook = Notebook(new_text)  # what remains is located in the fixed cells
    _into_cells(notebook, result)
    return result


def _into_cells(notebook: Notebook, result: FileResult) -> None:
    mapped: Set[int] = set()
    for finding in result.findings:
        cell, row = notebook.locate(finding.location.row)
        end_cell, end_row = notebook.locate(finding.end_location.row)
        finding.cell = cell
        finding.location = Location(row, finding.location.column)
        finding.end_location = (
            Location(end_row, finding.end_location.column) if end_cell == cell else Location(row, finding.location.column + 1)
        )
        finding.noqa_row = notebook.locate(finding.noqa_row)[1] if finding.noqa_row else 0
        if finding.fix is not None and id(finding.fix) not in mapped:
            mapped.add(id(finding.fix))
            finding.fix.edits = _edits_in_cell(notebook, finding, cell)
    result.findings.sort(key=Finding.sort_key)
    result.errors = [dataclasses.replace(error, message=_AT.sub(lambda m: _cell_position(notebook, m), error.message)) for error in result.errors]


def _edits_in_cell(notebook: Notebook, finding: Finding, cell: int):
    """The fix's edits relative to the finding's cell; none when they reach into another cell."""
    edits = []
    for edit in finding.fix.edits:
        start_cell, start_row = notebook.locate(edit.location.row)
        end_cell, end_row = notebook.locate(edit.end_location.row)
        if edit.end_location.row > len(notebook.owner):  # an insertion at the very end
            end_cell, end_row = start_cell, start_row + 1
        if start_cell != cell or end_cell != cell:
            return ()
        edits.append(Edit(Location(start_row, edit.location.column), Location(end_row, edit.end_location.column), edit.content))
    return tuple(edits)


def _cell_position(notebook: Notebook, match: "re.Match[str]") -> str:
    cell, row = notebook.locate(int(match.group(1)))
    return f"at cell {cell}:{row}:{match.group(2)}"
