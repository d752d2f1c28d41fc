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

import gc
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple, Union

from ampmigrate.config import Settings
from ampmigrate.diagnostics import FileError, Finding
from ampmigrate.engine import prescreen, workers
from ampmigrate.engine.cache import Cache, content_hash, has_fix_to_apply
from ampmigrate.engine.results import TOO_DEEP, FileResult
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.index_builder import IndexBeside
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.notebook import is_notebook
from ampmigrate.source import FileTooLarge, SourceError, SourceFile, read_regular_file, write_atomic

if TYPE_CHECKING:  # the engine imports LibCST: a run whose files are all cached never needs it
    from ampmigrate.engine.pipeline import Engine

# Below this many files, worker start-up costs more than it saves.
PARALLEL_THRESHOLD = 8
# Files at least this large that need LibCST are analysed in the second round, largest first.
LARGE_FILE = 32 * 1024
# A file over max-file-size is still scanned by the trigger regexes (reported only when one
# matches); one over this many times the limit is not even read.
READ_LIMIT_FACTOR = 8
# Control characters Python's tokenizer refuses outside strings and comments (NUL is refused
# by SourceFile already; tab, line feed, form feed and carriage return are whitespace).
_CONTROL_CHARACTER = re.compile(rb"[\x01-\x08\x0b\x0e-\x1f\x7f]")


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
    """Round one's answer for a large file that needs LibCST (every such file, while the project
    index is pending): do it in round two. The rules the pre-filter chose (`rule_key`) are
    reused there if the file still has the same bytes; `rules` None: round two decides (a
    notebook). `index_rules`: the triggers of a rule that reports only through the project
    index matched (round one had no index to tell whether it applies)."""

    size: int
    digest: str
    rules: Optional[Tuple[str, ...]]
    index_rules: bool = False
    parses: bool = False  # `ast` parsed it (the screens): LibCST's guard need not parse it again


def rule_key(rule) -> str:
    """One rule, the same in every process (several rules may share a code)."""
    return f"{type(rule).__module__}.{type(rule).__qualname__}"


def process_file(engine: Engine, path: str, job: Job, cache: Optional[Cache] = None) -> FileResult:
    outcome = _process(engine, path, job, cache, defer_large=False)
    assert isinstance(outcome, FileResult)
    if cache is not None:
        _keep(cache, job, outcome)
        cache.flush()
    return outcome


def _process(
    engine: Engine,
    path: str,
    job: Job,
    cache: Optional[Cache],
    defer_large: bool,
    screened: Optional[_Deferred] = None,
    pending: bool = False,
) -> Union[FileResult, _Deferred]:
    """One file, start to end; whatever goes wrong is this file's error, never the run's.
    `pending`: the project index is not built yet (`engine.index` is None, its rules are all
    the candidates): every file that needs LibCST is deferred, and the digests lack the index's
    part (`_with_index` adds it in the run's process)."""
    try:
        return _process_unguarded(engine, path, job, cache, defer_large, screened, pending)
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
    pending: bool = False,
) -> Union[FileResult, _Deferred]:
    try:
        source = _read(path, engine.settings.max_file_size * READ_LIMIT_FACTOR)
    except FileTooLarge as exc:
        return FileResult(path, errors=[FileError(path, _too_large(exc.size, engine.settings))])
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    digest = _digest(source.raw, path, engine.project, engine.index) if cache is not None or defer_large or screened or pending else ""
    if cache is not None:
        cached = _cached(cache, path, job, digest)
        if cached is not None:
            return cached
    try:
        text = source.text
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    if is_notebook(path):
        if pending:
            return _Deferred(len(source.raw), digest, None, True)
        from ampmigrate.engine.notebooks import process_notebook

        result = process_notebook(engine, text, path, job.mode, unsafe=job.unsafe, want_edits=job.want_edits)
        if cache is not None and _cacheable(result, job):
            result.cache_digest = digest
        return result
    if _CONTROL_CHARACTER.search(source.raw) is not None:
        # Binary data that happens to decode: Python accepts these bytes only inside strings
        # and comments, so a file with one is reported unless Python's parser accepts it.
        from ampmigrate.engine.pipeline import python_rejects

        rejected = python_rejects(text)
        if rejected is not None:
            return FileResult(path, errors=[FileError(path, f"not Python source: {rejected}")])
    too_large = len(source.raw) > engine.settings.max_file_size
    if screened is not None and screened.rules is not None and screened.digest == digest:
        rules = [rule for rule in engine.rules if rule_key(rule) in screened.rules]
        if screened.parses:
            prescreen.accepted(text)
    else:
        # An oversized file is only reported when a trigger matches; it is not even parsed by `ast`.
        rules = engine.rules_for(text, path, screen=not too_large)
    if pending:
        index_rules = engine.index_rules_match(text)
        if rules or index_rules:
            keys = tuple(rule_key(rule) for rule in rules)
            return _Deferred(len(source.raw), digest, keys, index_rules, prescreen.parsed_last(text))
    if rules and too_large:
        result = FileResult(path, errors=[FileError(path, _too_large(len(source.raw), engine.settings))])
    elif rules and defer_large and len(source.raw) >= LARGE_FILE:
        return _Deferred(len(source.raw), digest, tuple(rule_key(rule) for rule in rules), False, prescreen.parsed_last(text))
    elif job.mode == "check":
        result = engine.check_text(text, path, want_edits=job.want_edits, rules=rules)
    else:
        result = _fix(engine, source.decoded, path, job, rules)
    if cache is not None and _cacheable(result, job):
        result.cache_digest = digest  # stored by the run's process (`_keep`), which writes the cache
    return result


def _keep(cache: Optional[Cache], job: Job, result: FileResult) -> None:
    """Store a result that a worker (or `process_file`) found cacheable, in the run's process."""
    if cache is not None and result.cache_digest is not None:
        cache.store(result.path, job.cache_kind, result.cache_digest, result.findings, result.errors, result.parsed)


def _digest(
    raw: Optional[bytes], path: str, project: Optional[ProjectImports], index: Optional[ProjectIndex], content: str = ""
) -> str:
    """What a file's result depends on besides the run's settings: its bytes (`content`: their
    hash, where known), in fix mode the names other modules import from it (their fixes are
    withheld), and what rules learn about it from other files (the project index)."""
    digest = content or content_hash(raw or b"")
    imported = project.imported_from(path) if project is not None else ()
    if imported:
        digest += ":" + ",".join(sorted(imported))
    return _with_index(digest, path, index)


def _with_index(digest: str, path: str, index: Optional[ProjectIndex]) -> str:
    """`digest` (bytes and imports) with what the file's result depends on in the index."""
    depends = index.dependency_key(path) if index is not None else ""
    return digest + "@" + depends if depends else digest


def _cached(cache: Cache, path: str, job: Job, digest: str) -> Optional[FileResult]:
    cached = cache.load(path, job.cache_kind, digest)
    if cached is not None:
        findings, errors, parsed = cached
        if job.mode == "check" or not has_fix_to_apply(findings, job.unsafe):
            return FileResult(path, findings=findings, errors=errors, parsed=parsed)
    return None


def _from_cache(
    path: str, job: Job, cache: Cache, settings: Settings, project: Optional[ProjectImports], index: Optional[ProjectIndex]
) -> Optional[FileResult]:
    """In the parent, before any worker: a stored result, or the error of a file that cannot be
    read. A warm run so needs no worker at all. A file with no entry at all is not read here
    (a cold run reads and hashes each file once, in its worker)."""
    if not cache.has_entry(path, job.cache_kind):
        return None
    # The project index hashed the bytes it read moments ago: a warm run reads each file once.
    content = index.content_hash(path) if index is not None else None
    if content is not None:
        return _cached(cache, path, job, _digest(None, path, project, index, content))
    try:
        raw = read_regular_file(path, settings.max_file_size * READ_LIMIT_FACTOR)
    except FileTooLarge as exc:
        return FileResult(path, errors=[FileError(path, _too_large(exc.size, settings))])
    except SourceError as exc:
        return FileResult(path, errors=[FileError(path, str(exc))])
    return _cached(cache, path, job, _digest(raw, path, project, index))


def _too_large(size: int, settings: Settings) -> str:
    return f"skipped: {size / (1024 * 1024):.1f} MiB exceeds max-file-size ({settings.max_file_size / (1024 * 1024):.1f} MiB)"


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


def _read(path: str, limit: int) -> _LazySource:
    return _LazySource(path, read_regular_file(path, limit))


# ---------------------------------------------------------------------------------- workers
_WORKER: Optional[Tuple[Engine, Optional[Cache], Job, bool]] = None


def _init_worker(
    settings: Settings,
    cache: Optional[Cache],
    project: Optional[ProjectImports],
    index: Optional[ProjectIndex],
    job: Job,
    pending: bool = False,
) -> None:
    global _WORKER
    from ampmigrate.engine.pipeline import Engine  # imported before the fork (_run_in_workers)

    engine = Engine(settings, project=project, index=index, index_pending=pending)
    engine.before_parse = workers.new_parse  # each LibCST parse gets the whole budget
    _WORKER = (engine, cache, job, pending)


def _give_index(index: ProjectIndex) -> None:
    """In a worker of a run whose index was pending: the index is here (`_init_worker` with it)."""
    global _WORKER
    assert _WORKER is not None
    engine, cache, job, _ = _WORKER
    _init_worker(engine.settings, cache, engine.project, index, job)


def _worker_item(item: Tuple[str, bool, Optional[_Deferred]]) -> Union[FileResult, _Deferred]:
    """One file in a worker: round one (`defer_large`) or round two (`screened` given)."""
    assert _WORKER is not None
    engine, cache, job, pending = _WORKER
    path, defer_large, screened = item
    return _process(engine, path, job, cache, defer_large=defer_large, screened=screened, pending=pending)


def limits(settings: Settings) -> workers.Limits:
    return workers.Limits(cpu_seconds=settings.file_time_limit, memory_mib=settings.file_memory_limit)


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
    index: Union[ProjectIndex, IndexBeside, None] = None,
) -> RunResult:
    """Every file in worker processes (engine/workers.py), also with one job: a file that
    crashes the parser, or goes over its time or memory budget, is that file's error.
    `index` may still be being built (engine/index_builder.py): the workers then screen the
    files meanwhile, and analyse those that need LibCST once it is here."""
    pending = index if isinstance(index, IndexBeside) else None
    try:
        return _run_files(files, settings, job, jobs, on_result, cache, project, index, pending)
    finally:
        if pending is not None:
            pending.close()


def _run_files(
    files: Sequence[str],
    settings: Settings,
    job: Job,
    jobs: Optional[int],
    on_result: Optional[Callable[[FileResult], None]],
    cache: Optional[Cache],
    project: Optional[ProjectImports],
    index: Union[ProjectIndex, IndexBeside, None],
    pending: Optional[IndexBeside],
) -> RunResult:
    jobs = max(1, jobs or os.cpu_count() or 1)
    result = RunResult()
    slots: List[Optional[FileResult]] = [None] * len(files)

    def done(slot: int, outcome: Union[FileResult, workers.Failure]) -> None:
        if isinstance(outcome, workers.Failure):
            outcome = FileResult(files[slot], errors=[FileError(files[slot], outcome.reason)])
        slots[slot] = outcome
        _keep(cache, job, outcome)
        if on_result:
            on_result(outcome)

    todo: List[int] = []
    for slot, path in enumerate(files):
        if pending is not None and cache is not None and cache.has_entry(path, job.cache_kind):
            index, pending = pending.result(), None  # a stored result's key needs the index
        stored = _from_cache(path, job, cache, settings, project, index) if cache is not None else None
        if stored is not None:
            done(slot, stored)
        else:
            todo.append(slot)
    try:
        if todo and pending is not None:
            _run_pending(files, todo, settings, job, jobs, cache, project, pending, done)
        elif todo:
            _run_in_workers(files, todo, settings, job, jobs, cache, project, index, done)
    finally:
        if cache is not None:
            cache.flush()  # one write per pack that changed (engine/cache.py)
    result.results = [outcome for outcome in slots if outcome is not None]
    return result


def import_engine() -> None:
    """The engine (LibCST, the rules), imported once, before the workers are forked: only a run
    with files to analyse pays for it (a cold run imports it while its project index is built,
    engine/index_builder.py)."""
    from ampmigrate.engine import collector

    with collector.paused():  # importing makes no garbage: no collection meanwhile
        import ampmigrate.engine.pipeline  # noqa: F401
        from ampmigrate.engine.prefilter import compile_regexes
        from ampmigrate.rules import all_rules

        compile_regexes(all_rules())  # once here, not in each worker (engine/fast_regex.py keeps them)
        try:
            import libcst.native  # noqa: F401  (LibCST imports its parser at the first parse: in each worker)
        except ImportError:  # pragma: no cover - a LibCST without the native parser
            pass


def _pool_size(todo: Sequence[int], jobs: int) -> int:
    return 1 if len(todo) < PARALLEL_THRESHOLD else min(jobs, len(todo))


def _chunks(files: Sequence[str], todo: Sequence[int], size: int, defer: bool) -> List[List[Tuple[int, Tuple]]]:
    """Round one's batches: (index, (path, defer_large, None)), about eight per worker."""
    chunksize = max(1, min(64, len(todo) // (size * 8)))
    numbered = [(index, (files[index], defer, None)) for index in todo]
    return [numbered[start : start + chunksize] for start in range(0, len(numbered), chunksize)]


def _run_in_workers(
    files: Sequence[str],
    todo: List[int],
    settings: Settings,
    job: Job,
    jobs: int,
    cache: Optional[Cache],
    project: Optional[ProjectImports],
    index: Optional[ProjectIndex],
    done: Callable[[int, Union[FileResult, workers.Failure]], None],
) -> None:
    """The files at the indices `todo`, in a pool of watched workers (two rounds, see above)."""
    import_engine()

    size = _pool_size(todo, jobs)
    # With one worker nothing waits on a large file: no second round.
    chunks = _chunks(files, todo, size, defer=size > 1)
    deferred: List[Tuple[int, int, _Deferred]] = []  # (size, index, round one's answer)
    pool = workers.WorkerPool(size, _init_worker, (settings, cache, project, index, job), _worker_item, limits(settings))
    # What the workers inherit (the engine's modules, the project index) is frozen out of the
    # cyclic collector's reach: a worker's collections never walk it, nor copy its pages.
    gc.freeze()
    try:
        with pool:
            for index, outcome in pool.run(chunks):
                if isinstance(outcome, _Deferred):
                    deferred.append((outcome.size, index, outcome))
                else:
                    done(index, outcome)
            deferred.sort(key=lambda item: (-item[0], item[1]))  # largest first
            second = [[(index, (files[index], False, screened))] for _, index, screened in deferred]
            for index, outcome in pool.run(second):
                done(index, outcome)
    finally:
        gc.unfreeze()  # collectable again in this process (a long-lived one: watch, server)


def _run_pending(
    files: Sequence[str],
    todo: List[int],
    settings: Settings,
    job: Job,
    jobs: int,
    cache: Optional[Cache],
    project: Optional[ProjectImports],
    pending: IndexBeside,
    done: Callable[[int, Union[FileResult, workers.Failure]], None],
) -> None:
    """`_run_in_workers` while the project index is still being built: round one's workers
    (forked without it: `Engine(index_pending=True)`) read and screen every file and flag each
    that needs LibCST; once the index is here, they are given it and analyse the flagged
    files, largest first, with only the rules that apply to a run with this index."""
    import_engine()

    size = _pool_size(todo, jobs)
    # While the child builds the index it has a CPU of its own: round one starts with one
    # worker fewer, and the last one is forked when the child is done (`pending.ready()`), for
    # round one's files left and then round two. Three processes on two CPUs slow each other
    # down (about 40 ms more CPU time on Lightning), and the child is done before round one.
    first = max(1, size - 1)
    chunks = _chunks(files, todo, size, defer=False)
    finished: List[Tuple[int, Union[FileResult, workers.Failure]]] = []
    deferred: List[Tuple[int, int, _Deferred]] = []
    pool = workers.WorkerPool(first, _init_worker, (settings, cache, project, None, job, True), _worker_item, limits(settings))
    gc.freeze()  # as in _run_in_workers
    try:
        with pool:
            grown = first == size
            for slot, outcome in pool.run(chunks):
                if not grown and pending.ready():
                    pool.grow(size)
                    grown = True
                if isinstance(outcome, _Deferred):
                    deferred.append((outcome.size, slot, outcome))
                else:
                    finished.append((slot, outcome))
            index = pending.result()
            from ampmigrate.engine.pipeline import Engine

            engine = Engine(settings, project=project, index=index)  # the rules of this run
            keys = {rule_key(rule) for rule in engine.rules}
            rescreen = engine.index_rules_apply()
            for slot, outcome in finished:
                if isinstance(outcome, FileResult) and outcome.cache_digest is not None:
                    outcome.cache_digest = _with_index(outcome.cache_digest, outcome.path, index)
                done(slot, outcome)
            second = []
            for _, slot, flagged in sorted(deferred, key=lambda item: (-item[0], item[1])):  # largest first
                digest = _with_index(flagged.digest, files[slot], index)
                if flagged.rules is None or (flagged.index_rules and rescreen):
                    flagged = _Deferred(flagged.size, digest, None)  # round two screens it again
                else:
                    kept = tuple(key for key in flagged.rules if key in keys)
                    flagged = _Deferred(flagged.size, digest, kept, False, flagged.parses)
                    if not flagged.rules:  # no rule of this run is left for it: nothing to analyse
                        done(slot, FileResult(files[slot], cache_digest=digest if cache is not None else None))
                        continue
                second.append([(slot, (files[slot], False, flagged))])
            if not second:
                return
            # Round one's workers go on, given the index (a worker forked anew would copy
            # the pages it touches of this process again).
            pool.reinitialize((settings, cache, project, index, job), _give_index, (index,))
            pool.grow(size)  # a worker round one did without: forked given the index
            for slot, outcome in pool.run(second):
                done(slot, outcome)
    finally:
        gc.unfreeze()


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
