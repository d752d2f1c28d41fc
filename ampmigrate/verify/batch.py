"""Running the K runs of each side: a few at a time, with a live step count, threads set.

A verify costs 2K runs (3K with a bug-fix program), so they run `jobs` at a time. Each run gets
an equal share of the CPU's cores as its thread count (OMP_NUM_THREADS and the BLAS libraries'
variables, unless the user set them): without it every run starts a thread per core and runs that
share a small CPU thrash. Runs of the same seed are started side by side, so the before and the
after of a pair see the same load.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ampmigrate.verify.runner import RunResult, RunSpec, TimeLimit, execute

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
POLL_SECONDS = 0.5

Progress = Callable[[str], None]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def plan_jobs(requested: Optional[int], runs: int, device: str) -> int:
    """How many runs at a time: one per core on the CPU (at most `runs`), one on a GPU."""
    if requested:
        return max(1, requested)
    if device == "cuda":
        return 1  # runs that share a GPU disturb each other's timing and memory
    return max(1, min(runs, cpu_count()))


def thread_env(jobs: int) -> Dict[str, str]:
    """Thread counts for each run (the user's own settings win)."""
    threads = str(max(1, cpu_count() // jobs))
    return {name: threads for name in THREAD_VARIABLES if name not in os.environ}


def run_all(
    specs: Sequence[Tuple[RunSpec, str]],
    workdir: str,
    *,
    jobs: int,
    limit: TimeLimit,
    live: Progress,
) -> List[RunResult]:
    """Run every (spec, name), `jobs` at a time, in order; `live` gets a status line while they run.

    Runs go on in worker threads, but signals (Ctrl-C, and SIGTERM/SIGHUP through
    runner.termination_as_interrupt) reach the main thread only: when it is interrupted, every
    running run's process group is killed and the runs not started yet never start."""
    env = thread_env(jobs)
    specs = [(replace(spec, env={**env, **spec.env}), name) for spec, name in specs]
    running: Dict[str, Tuple[str, int]] = {}  # name -> (label, steps wanted)
    lock = threading.Lock()
    done = threading.Event()
    cancel = threading.Event()

    def one(item: Tuple[RunSpec, str]) -> RunResult:
        spec, name = item
        with lock:
            running[name] = (f"{spec.label} seed {spec.seed}", spec.steps)
        try:
            return execute(spec, workdir, name, limit=limit, cancel=cancel)
        finally:
            with lock:
                running.pop(name, None)

    def watch() -> None:
        while not done.wait(POLL_SECONDS):
            with lock:
                current = dict(running)
            if current:
                live(" | ".join(f"{label}: step {_steps(workdir, name)}/{total}" for name, (label, total) in current.items()))

    watcher = threading.Thread(target=watch, name="ampmigrate-step-counter", daemon=True)
    watcher.start()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        return list(pool.map(one, specs))
    except BaseException:
        cancel.set()  # each worker kills its run within a poll (runner._wait)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        done.set()
        watcher.join()


def _steps(workdir: str, name: str) -> int:
    try:
        with open(os.path.join(workdir, "progress", name), "rb") as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return 0
