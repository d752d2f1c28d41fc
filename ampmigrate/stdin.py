"""`ampmigrate check -` / `fix -`: one file's text from standard input.

`--stdin-filename` names the file the text stands for: it chooses the configuration's
per-file-ignores, whether the text is a notebook (`.ipynb`), and the path in messages.
"""

from __future__ import annotations

import sys
from typing import Optional


from ampmigrate.config import Settings
from ampmigrate.diagnostics import FileError
from ampmigrate.engine.notebooks import process_notebook
from ampmigrate.engine.pipeline import Engine, FileResult
from ampmigrate.engine.runner import Job, RunResult
from ampmigrate.notebook import is_notebook
from ampmigrate.source import SourceError, SourceFile

STDIN_NAME = "-"


def run_stdin(settings: Settings, job: Job, filename: Optional[str]) -> RunResult:
    path = filename or STDIN_NAME
    raw = sys.stdin.buffer.read()
    try:
        source = SourceFile.from_bytes(path, raw)
    except SourceError as exc:
        return RunResult(results=[FileResult(path, errors=[FileError(path, str(exc))])])
    engine = Engine(settings)
    if is_notebook(path):
        result = process_notebook(engine, source.text, path, job.mode, unsafe=job.unsafe, want_edits=job.want_edits)
    elif job.mode == "check":
        result = engine.check_text(source.text, path, want_edits=job.want_edits)
    else:
        result = engine.fix_text(source.text, path, unsafe=job.unsafe)
    result.source = source  # type: ignore[attr-defined] - to encode the fixed text as read
    return RunResult(results=[result])


def stdin_output(result: FileResult) -> bytes:
    """What `fix -` writes: the fixed text in the input's encoding, or the input unchanged."""
    source: SourceFile = result.source  # type: ignore[attr-defined]
    if result.new_text is None:
        return source.raw
    return source.encode(result.new_text)
