"""Running the engine over many files: reading, the cache, size limits, worker processes, writing.

Per file, cheapest first: read the bytes; with a cache, a hash of them finds a stored result;
else decode, pre-filter (engine/prefilter.py: regexes, then an `ast` screen) and, only for the
few files that can hold a finding, parse and analyse with LibCST.

With several jobs, worker processes do all of that and send back only plain results (findings,
errors, fixed text), never source text or trees. Work is spread in two rounds: first every file
in chunks, where small files are finished on the spot and large files that need LibCST are
only flagged; then the flagged files one at a time, largest first, so that one big file does not
start last and leave the other workers idle. Results come back in the order of the input files,
so output is deterministic whatever the number of jobs. Writing happens in the parent, one file
at a time, atomically.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple, Union

from ampmigrate.config import Settings
from ampmigrate.diagnostics import FileError, Finding
from ampmigrate.engine.cache import Cache, content_hash, has_fix_to_apply
from ampmigrate.engine.pipeline import TOO_DEEP, Engine, FileResult
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.source import SourceError, SourceFile, read_bytes, write_atomic

# Below this many files, worker start-up costs more than it saves.
PARALLEL_THRESHOLD = 8
# Files at least this large that need LibCST are analysed in the second round, largest first.
LARGE_FILE = 32 * 1024


@dataclass(frozen=True)
class Job:
    mode: str  # "check" | "fix"
    unsafe: bool = False
    want_edits: bool = False

    @property
    def cache_kind(self) -> str:
        """The cache entries this job reads: check results, with or without fix edits."""
        return "check+edits" if self.mode == "check" and self.want_edits else "check"


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
@dataclass(frozen=True)
class _Deferred:
    """Round one's answer for a large file that needs LibCST: do it in round two. The rules
    the pre-filter chose are reused there if the file still has the same bytes."""

    size: int
    digest: str
    codes: Tuple[str, ...]


def process_file(engine: Engine, path: str, job: Job, cache: Optional[Cache] = None) -> FileResult:
    outcome = _process(engine, path, job, cache, defer_large=False)
    assert isinstance(outcome, FileResult)
    return outcome


def _process(
    engine: Engine,
    path: str,
    job: Job,
    cache: Optional[Cache],
    defer_large: bool,
    screened: Optional[_Deferred] = None,
) -> Union[FileResult, _Deferred]:
    """One file, start to end; whatever goes wrong is this file's error, never the run's."""
    try:
        return _process_unguarded(engine, path, job, cache, defer_large, screened)
    except RecursionError:
        return FileResult(path, errors=[FileError(path, TOO_DEEP)])
    except Exception as exc:  # an engine bug must not stop the run
        return FileResult(path, errors=[FileError(path, f"internal error: {type(exc).__name__}: {exc}")])


def _process_unguarded(
    engine: Engine,
    path: str,
    job: Job,
    cache: Optional[Cache],
    defer_large: bool,
    screened: Optional[_Deferred] = None,
) -> Union[FileResult, _Deferred]:
    try:
        source = _read(path)
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    digest = content_hash(source.raw) if cache is not None or defer_large or screened else ""
    imported = engine.project.imported_from(path) if digest and engine.project is not None else ()
    if imported:
        # Fix mode withholds fixes of names other modules import from this one: part of the result.
        digest += ":" + ",".join(sorted(imported))
    if digest and engine.index is not None:
        # What rules learn from other files (the project index) is part of the result too.
        depends = engine.index.dependency_key(path)
        if depends:
            digest += "@" + depends
    if cache is not None:
        cached = cache.load(path, job.cache_kind, digest)
        if cached is not None:
            findings, errors, parsed = cached
            if job.mode == "check" or not has_fix_to_apply(findings, job.unsafe):
                return FileResult(path, findings=findings, errors=errors, parsed=parsed)
    try:
        text = source.text
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    too_large = len(source.raw) > engine.settings.max_file_size
    if screened is not None and screened.digest == digest:
        rules = [rule for rule in engine.rules if rule.code in screened.codes]
    else:
        # An oversized file is only reported when a trigger matches; it is not even parsed by `ast`.
        rules = engine.rules_for(text, screen=not too_large)
    if rules and too_large:
        size = len(source.raw) / (1024 * 1024)
        limit = engine.settings.max_file_size / (1024 * 1024)
        result = FileResult(path, errors=[FileError(path, f"skipped: {size:.1f} MiB exceeds max-file-size ({limit:.1f} MiB)")])
    elif rules and defer_large and len(source.raw) >= LARGE_FILE:
        return _Deferred(len(source.raw), digest, tuple(rule.code for rule in rules))
    elif job.mode == "check":
        result = engine.check_text(text, path, want_edits=job.want_edits, rules=rules)
    else:
        result = _fix(engine, source.decoded, path, job, rules)
    if cache is not None and _cacheable(result, job):
        cache.store(path, job.cache_kind, digest, result.findings, result.errors, result.parsed)
    return result


def _fix(engine: Engine, source: SourceFile, path: str, job: Job, rules) -> FileResult:
    result = engine.fix_text(source.text, path, unsafe=job.unsafe, rules=rules)
    if result.new_text is not None:
        try:
            source.encode(result.new_text)
        except UnicodeEncodeError:
            result.errors.append(FileError(path, f"fixed text cannot be encoded as {source.encoding}; not written"))
            result.new_text = result.old_text = None
    return result


def _cacheable(result: FileResult, job: Job) -> bool:
    if job.mode == "check":
        return True
    # A file `fix` left alone, with nothing it could fix: exactly what `check` finds there.
    return result.new_text is None and result.fixed == 0 and not has_fix_to_apply(result.findings, job.unsafe)


class _LazySource:
    """The bytes of a file now, its decoded text only when a cache miss needs it."""

    def __init__(self, path: str, raw: bytes) -> None:
        self.path = path
        self.raw = raw
        self._decoded: Optional[SourceFile] = None

    @property
    def decoded(self) -> SourceFile:
        if self._decoded is None:
            self._decoded = SourceFile.from_bytes(self.path, self.raw)
        return self._decoded

    @property
    def text(self) -> str:
        return self.decoded.text


def _read(path: str) -> _LazySource:
    return _LazySource(path, read_bytes(path))


# ---------------------------------------------------------------------------------- workers
_WORKER: Optional[Tuple[Engine, Optional[Cache]]] = None


def _init_worker(
    settings: Settings, cache: Optional[Cache], project: Optional[ProjectImports], index: Optional[ProjectIndex]
) -> None:
    global _WORKER
    _WORKER = (Engine(settings, project=project, index=index), cache)


def _worker_round_one(chunk: List[Tuple[int, str]], job: Job) -> List[Tuple[int, Union[FileResult, _Deferred]]]:
    assert _WORKER is not None
    engine, cache = _WORKER
    return [(index, _process(engine, path, job, cache, defer_large=True)) for index, path in chunk]


def _worker_round_two(index: int, path: str, job: Job, screened: _Deferred) -> Tuple[int, FileResult]:
    assert _WORKER is not None
    engine, cache = _WORKER
    outcome = _process(engine, path, job, cache, defer_large=False, screened=screened)
    assert isinstance(outcome, FileResult)
    return index, outcome


# ---------------------------------------------------------------------------------- many files
def run_files(
    files: Sequence[str],
    settings: Settings,
    job: Job,
    *,
    jobs: Optional[int] = None,
    on_result: Optional[Callable[[FileResult], None]] = None,
    cache: Optional[Cache] = None,
    project: Optional[ProjectImports] = None,
    index: Optional[ProjectIndex] = None,
) -> RunResult:
    jobs = max(1, jobs or os.cpu_count() or 1)
    result = RunResult()
    if jobs == 1 or len(files) < PARALLEL_THRESHOLD:
        engine = Engine(settings, project=project, index=index)
        for path in files:
            outcome = process_file(engine, path, job, cache)
            result.results.append(outcome)
            if on_result:
                on_result(outcome)
        return result
    slots: List[Optional[FileResult]] = [None] * len(files)
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    workers = min(jobs, len(files))
    chunksize = max(1, min(64, len(files) // (workers * 8)))
    numbered = list(enumerate(files))
    chunks = [numbered[start : start + chunksize] for start in range(0, len(numbered), chunksize)]
    deferred: List[Tuple[int, int, _Deferred]] = []  # (size, index, round one's answer)

    def done(index: int, outcome: FileResult) -> None:
        slots[index] = outcome
        if on_result:
            on_result(outcome)

    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(settings, cache, project, index)) as pool:
        for answers in pool.map(_worker_round_one, chunks, [job] * len(chunks)):
            for index, outcome in answers:
                if isinstance(outcome, _Deferred):
                    deferred.append((outcome.size, index, outcome))
                else:
                    done(index, outcome)
        deferred.sort(key=lambda item: (-item[0], item[1]))  # largest first
        futures = [pool.submit(_worker_round_two, index, files[index], job, screened) for _, index, screened in deferred]
        for future in futures:
            done(*future.result())
    result.results = [outcome for outcome in slots if outcome is not None]
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
