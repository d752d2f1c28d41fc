"""Worker processes the parent watches, so that no file can take the run down or hang it.

LibCST's native parser can crash the process (a segfault on thousands of nested brackets) and
is quadratic on some shapes (a chain of 20,000 `+`), and a rule could loop. So files are
processed in worker processes, even with one job, and the parent watches each one:

- a worker that dies (a signal, an abort) costs only the file it was on: that file is reported,
  a new worker takes the old one's place and goes on with the files it had not reached;
- each file has a budget of CPU time and memory (`Limits`), counted afresh for each LibCST parse
  (a `fix` parses once per round): the parent reads the worker's CPU time and resident memory
  from `/proc` and kills a worker over budget, and the file is reported as skipped. Memory is
  counted from what the worker held when it took its first file: a forked worker starts with the
  parent's pages resident, which no file of its own put there;
- workers die with the parent, even one killed by SIGKILL (PR_SET_PDEATHSIG on Linux; elsewhere
  a worker notices when the parent's end of its pipe closes, between files).

A worker streams one message per event: ("setup",) when it has been set up again,
("file", key, cpu) when it starts a batch's first file,
("round", cpu) when it starts a parse, ("done", key, result, cpu) when it has a file's result and
goes on to the next file of its batch, where `cpu` is its CPU time then (the budget's start: the
parent need not read `/proc` for it). The parent so always knows which file a dead or killed
worker was on (the first of its batch not done). It looks at busy workers' CPU time and memory
in `/proc` every `POLL_INTERVAL`, not after every message (a cold run sends one per file).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

# How often the parent looks at busy workers' CPU time and memory.
POLL_INTERVAL = 0.05
# A worker that uses no CPU time (e.g. it sleeps) is still stopped after this many times the
# CPU budget in wall-clock time: a busy machine slows a worker down, it does not stop it.
WALL_FACTOR = 10

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Limits:
    """What one file (one parse of it) may cost a worker."""

    cpu_seconds: float
    memory_mib: int


@dataclass(frozen=True)
class _Reinitialize:
    """A message to a worker: run `setup(*args)` (`WorkerPool.reinitialize`)."""

    setup: Callable
    args: Tuple


@dataclass(frozen=True)
class Failure:
    """A file the worker did not finish: it died on it, or went over its budget."""

    reason: str


# ---------------------------------------------------------------------------------- in the worker
_CONNECTION: Optional[Connection] = None


def new_parse() -> None:
    """Called in a worker before each LibCST parse: the budget starts afresh."""
    if _CONNECTION is not None:
        _CONNECTION.send(("round", time.process_time()))


def _libc():
    """The C library, for `prctl` (Linux): loaded in the run's process before it forks, so that
    each worker (and the project index's child) need not import ctypes and load it again."""
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None, use_errno=True)
        except (OSError, AttributeError, ImportError):
            _LIBC = False
    return _LIBC or None


_LIBC = None


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = _libc()
            PR_SET_PDEATHSIG = 1
            if libc is not None:
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the request above was made
        os._exit(1)


def _worker_main(
    connection: Connection, parents_end: Connection, parent: int, initializer: Callable, initargs: Tuple, process_item: Callable
) -> None:
    global _CONNECTION
    _die_with_parent(parent)
    parents_end.close()  # so that the parent's exit closes the pipe: recv() then ends the loop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _CONNECTION = connection
    initializer(*initargs)
    while True:
        try:
            items = connection.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone
        if items is None:
            os._exit(0)
        if isinstance(items, _Reinitialize):
            items.setup(*items.args)
            connection.send(("setup",))  # what it holds now (the index) is no file's memory
            continue
        # The batch's first file is announced; each "done" also starts the next file's budget
        # (the worker goes straight on to it): one message per file, not two.
        connection.send(("file", items[0][0], time.process_time()))
        for key, item in items:
            connection.send(("done", key, process_item(item), time.process_time()))


# ---------------------------------------------------------------------------------- in the parent
class _Worker:
    def __init__(self, context, initializer: Callable, initargs: Tuple, process_item: Callable) -> None:
        _libc()  # before the fork (see there)
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=_worker_main,
            args=(child, self.connection, os.getpid(), initializer, initargs, process_item),
            daemon=True,
        )
        self.process.start()
        child.close()
        self.pending: List[Tuple[Any, Any]] = []  # items sent and not yet done, in order
        self.current: Any = None  # the key of the item it is on
        self.cpu_start = 0.0
        self.wall_start = 0.0
        # Its resident memory when it took its first file. A forked worker starts with every page
        # of the parent counted resident (a parent holding a large tree's index passes 2 GiB); the
        # memory budget is what the worker has grown by since.
        self.baseline_mib: Optional[float] = None

    def start_budget(self, cpu: float) -> None:
        """The budget starts now; `cpu`: the worker's CPU time, as it reported it."""
        self.cpu_start = cpu
        self.wall_start = time.monotonic()
        if self.baseline_mib is None:
            self.baseline_mib = _resident_mib(self.process.pid) or 0.0

    def over_budget(self, limits: Limits) -> Optional[str]:
        pid = self.process.pid
        used = _cpu_seconds(pid) - self.cpu_start
        if used > limits.cpu_seconds or time.monotonic() - self.wall_start > limits.cpu_seconds * WALL_FACTOR:
            return f"skipped: analysing it took more than {limits.cpu_seconds:g} s (file-time-limit)"
        rss = _resident_mib(pid)
        if rss is not None and rss - (self.baseline_mib or 0.0) > limits.memory_mib:
            return f"skipped: analysing it needed more than {limits.memory_mib} MiB of memory (file-memory-limit)"
        return None

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass
        self.process.join()
        self.connection.close()

    def stop(self) -> None:
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.kill()
        else:
            self.connection.close()


class WorkerPool:
    """`size` worker processes, each set up by `initializer(*initargs)`, that run
    `process_item(item)` for every item of the batches given to `run`."""

    def __init__(
        self, size: int, initializer: Callable, initargs: Tuple, process_item: Callable, limits: Limits
    ) -> None:
        self.size = max(1, size)
        self.limits = limits
        self._spawn_args = (initializer, initargs, process_item)
        method = "fork" if sys.platform.startswith("linux") else None
        self._context = multiprocessing.get_context(method)
        self._workers: List[_Worker] = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc_info) -> None:
        for worker in self._workers:
            if exc_info[0] is None and not worker.pending:
                worker.stop()
            else:
                worker.kill()
        self._workers = []

    def reinitialize(self, initargs: Tuple, setup: Callable, args: Tuple) -> None:
        """From now on, new workers are set up by `initializer(*initargs)`, and those running
        run `setup(*args)` (a module-level function; `args` are pickled), which must set them up
        the same: cheaper than forking new ones, which copy the pages they touch again."""
        initializer, _, process_item = self._spawn_args
        self._spawn_args = (initializer, initargs, process_item)
        message = _Reinitialize(setup, args)
        for worker in self._workers:
            try:
                worker.connection.send(message)
            except OSError:
                pass  # it died: noticed (and replaced) when it is given work

    def grow(self, size: int) -> None:
        """Up to `size` workers from now on: a `run` in progress forks the new ones when it
        next looks for a worker to give work to."""
        self.size = max(self.size, size)

    def _spawn(self) -> _Worker:
        worker = _Worker(self._context, *self._spawn_args)
        self._workers.append(worker)
        return worker

    def run(self, batches: Sequence[Sequence[Tuple[Any, Any]]]) -> Iterator[Tuple[Any, Any]]:
        """Yield `(key, result)` for every `(key, item)` of every batch, as results come in;
        the result is a `Failure` for an item whose worker died or went over budget."""
        queue = [list(batch) for batch in reversed(batches) if batch]
        while len(self._workers) < min(self.size, len(queue)):
            self._spawn()
        idle = [w for w in self._workers if not w.pending]
        busy: Dict[Connection, _Worker] = {}
        checked = time.monotonic()  # when busy workers' budgets were last looked at

        def assign(worker: _Worker) -> None:
            batch = queue.pop()
            worker.pending = batch
            worker.current = None
            worker.connection.send(batch)
            busy[worker.connection] = worker

        def replace(worker: _Worker) -> None:
            """The worker is gone: its remaining items go back to the queue, a new one starts."""
            del busy[worker.connection]
            self._workers.remove(worker)
            rest = [item for item in worker.pending if item[0] != worker.current]
            if rest:
                queue.append(rest)
            idle.append(self._spawn())

        while queue or busy:
            if queue and len(self._workers) < self.size:  # `size` grew meanwhile (`grow`)
                idle.append(self._spawn())
            while idle and queue:
                assign(idle.pop())
            for connection in wait(list(busy), timeout=POLL_INTERVAL):
                worker = busy[connection]
                try:
                    message = connection.recv()
                except (EOFError, OSError):
                    # Died on its current file; before one started (while setting up), on the first.
                    key = worker.current if worker.current is not None else worker.pending[0][0]
                    worker.current = key
                    worker.kill()
                    reason = _death(worker.process.exitcode)
                    replace(worker)
                    yield key, Failure(reason)
                    continue
                kind = message[0]
                if kind == "setup":  # set up again (`reinitialize`): its memory is counted from here
                    worker.baseline_mib = None
                elif kind == "file":
                    worker.current = message[1]
                    worker.start_budget(message[2])
                elif kind == "round":
                    worker.start_budget(message[1])
                elif kind == "done":
                    key, result = message[1], message[2]
                    worker.pending = [item for item in worker.pending if item[0] != key]
                    worker.current = None
                    if worker.pending:  # the worker is on the next file of its batch now
                        worker.current = worker.pending[0][0]
                        worker.start_budget(message[3])
                    else:
                        del busy[connection]
                        idle.append(worker)
                    yield key, result
            if time.monotonic() - checked < POLL_INTERVAL:
                continue
            checked = time.monotonic()
            for worker in list(busy.values()):
                if worker.current is None:
                    continue
                reason = worker.over_budget(self.limits)
                if reason is not None:
                    key = worker.current
                    worker.kill()
                    replace(worker)
                    yield key, Failure(reason)


def _death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exit status {exitcode}"
    return f"internal error: the process analysing this file died ({how}); file skipped"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux), else 0 (then only wall-clock time counts)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def _resident_mib(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE_SIZE / (1024 * 1024)
    except (OSError, IndexError, ValueError):
        return None
