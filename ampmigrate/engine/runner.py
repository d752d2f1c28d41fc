"""Running the engine over many files: reading, size limits, worker processes, writing.

Workers each build one Engine and send back only plain results (findings, errors, new text).
Results are returned in the order of the input files, so output is deterministic whatever the
number of jobs. Writing happens in the parent, one file at a time, atomically.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence

from ampmigrate.config import Settings
from ampmigrate.diagnostics import FileError, Finding
from ampmigrate.engine.pipeline import TOO_DEEP, Engine, FileResult
from ampmigrate.engine.project import ProjectImports
from ampmigrate.source import SourceError, SourceFile, write_atomic

# Below this many files, worker start-up costs more than it saves.
PARALLEL_THRESHOLD = 8


@dataclass(frozen=True)
class Job:
    mode: str  # "check" | "fix"
    unsafe: bool = False
    want_edits: bool = False


@dataclass
class RunResult:
    results: List[FileResult] = field(default_factory=list)
    errors: List[FileError] = field(default_factory=list)

    @property
    def findings(self) -> List[Finding]:
        found = [f for r in self.results for f in r.findings]
        found.sort(key=Finding.sort_key)
        return found

    @property
    def all_errors(self) -> List[FileError]:
        return self.errors + [e for r in self.results for e in r.errors]

    @property
    def files(self) -> int:
        return len(self.results)

    @property
    def parsed(self) -> int:
        return sum(1 for r in self.results if r.parsed)

    @property
    def fixed(self) -> int:
        return sum(r.fixed for r in self.results)

    @property
    def changed(self) -> List[FileResult]:
        return [r for r in self.results if r.new_text is not None]


# ---------------------------------------------------------------------------------- one file
_ENGINE: Optional[Engine] = None


def _init_worker(settings: Settings, project: Optional[ProjectImports]) -> None:
    global _ENGINE
    _ENGINE = Engine(settings, project=project)


def process_file(engine: Engine, path: str, job: Job) -> FileResult:
    """One file, start to end; whatever goes wrong is this file's error, never the run's."""
    try:
        return _process_file(engine, path, job)
    except RecursionError:
        return FileResult(path, errors=[FileError(path, TOO_DEEP)])
    except Exception as exc:  # an engine bug must not stop the run
        return FileResult(path, errors=[FileError(path, f"internal error: {type(exc).__name__}: {exc}")])


def _process_file(engine: Engine, path: str, job: Job) -> FileResult:
    try:
        source = SourceFile.read(path)
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    if len(source.raw) > engine.settings.max_file_size and engine.rules_for(source.text):
        size = len(source.raw) / (1024 * 1024)
        limit = engine.settings.max_file_size / (1024 * 1024)
        return FileResult(path, errors=[FileError(path, f"skipped: {size:.1f} MiB exceeds max-file-size ({limit:.1f} MiB)")])
    if job.mode == "check":
        return engine.check_text(source.text, path, want_edits=job.want_edits)
    result = engine.fix_text(source.text, path, unsafe=job.unsafe)
    if result.new_text is not None:
        try:
            source.encode(result.new_text)
        except UnicodeEncodeError:
            result.errors.append(FileError(path, f"fixed text cannot be encoded as {source.encoding}; not written"))
            result.new_text = result.old_text = None
    return result


def _worker(args) -> FileResult:
    path, job = args
    assert _ENGINE is not None
    return process_file(_ENGINE, path, job)


# ---------------------------------------------------------------------------------- many files
def run_files(
    files: Sequence[str],
    settings: Settings,
    job: Job,
    *,
    jobs: Optional[int] = None,
    on_result: Optional[Callable[[FileResult], None]] = None,
    project: Optional[ProjectImports] = None,
) -> RunResult:
    jobs = max(1, jobs or os.cpu_count() or 1)
    result = RunResult()
    if jobs == 1 or len(files) < PARALLEL_THRESHOLD:
        engine = Engine(settings, project=project)
        outcomes: Iterable[FileResult] = (process_file(engine, path, job) for path in files)
        for outcome in outcomes:
            result.results.append(outcome)
            if on_result:
                on_result(outcome)
        return result
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    workers = min(jobs, len(files))
    chunksize = max(1, min(16, len(files) // (workers * 8)))
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(settings, project)) as pool:
        for outcome in pool.map(_worker, [(path, job) for path in files], chunksize=chunksize):
            result.results.append(outcome)
            if on_result:
                on_result(outcome)
    return result


def write_changes(result: RunResult) -> List[FileError]:
    """Write every changed file atomically; a file that changed on disk meanwhile is skipped."""
    errors = []
    for outcome in result.changed:
        try:
            source = SourceFile.read(outcome.path)
            if source.text != outcome.old_text:
                raise SourceError("file changed on disk while it was being fixed; not written")
            write_atomic(outcome.path, source.encode(outcome.new_text), source.raw)
        except SourceError as exc:
            errors.append(FileError(outcome.path, str(exc)))
            outcome.fixed = 0
    return errors
