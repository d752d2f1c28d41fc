"""The parent side of one run: a subprocess of the harness, its log, its result; and how runs
are contained: a process group of their own, killed with it when `verify` is interrupted,
terminated or dies; a time limit; the verify folder and its removal."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

AS_WRITTEN, FP32 = "as-written", "fp32"
NAMESPACE, REDIRECT = "namespace", "redirect"
WORKDIR_PREFIX = "ampmigrate-verify-"
_OWNER_FILE = "owner.pid"  # the pid of the verify that made the folder (`verify --clean` skips live ones)


@dataclass(frozen=True)
class RunSpec:
    label: str  # "before", "after", "baseline seed 1", ...
    script: str
    args: List[str]
    cwd: str
    steps: int
    seed: int
    device: str  # auto | cuda | cpu
    precision: str = AS_WRITTEN  # or FP32: autocast and GradScaler switched off
    seed_offset: int = 0  # added to the script's own seeding calls (noise-floor runs)
    protect: List[str] = field(default_factory=list)  # folders whose writes are redirected
    path_map: Dict[str, str] = field(default_factory=dict)  # original root -> migrated copy
    instrument: bool = True  # False: only count steps (the overhead benchmark's plain run)
    isolation: str = REDIRECT  # NAMESPACE: the run's own user and mount namespaces (isolation.py)
    env: Dict[str, str] = field(default_factory=dict)  # added to the run's environment
    python_path: List[str] = field(default_factory=list)  # put first on the run's import path


@dataclass
class RunResult:
    spec: RunSpec
    data: Dict[str, Any]
    log: str
    returncode: int

    @property
    def status(self) -> str:
        return self.data.get("status", "died")

    @property
    def losses(self) -> List[Optional[float]]:
        return self.data.get("losses", [])

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def error(self) -> Dict[str, Any]:
        return self.data.get("error") or {}

    @property
    def failed(self) -> bool:
        return self.status not in ("completed", "finished")

    @property
    def missing_module(self) -> Optional[str]:
        if self.error.get("type") in ("ImportError", "ModuleNotFoundError"):
            return self.error.get("module")
        return None

    @property
    def median_step_time(self) -> Optional[float]:
        """Median wall-clock seconds per step, leaving out the first steps (warm-up, lazy init)."""
        return _steady_median(self.data.get("step_intervals", []))

    @property
    def median_step_cpu_time(self) -> Optional[float]:
        """The same in process CPU time (all threads), which other load on the machine does not inflate."""
        return _steady_median(self.data.get("step_cpu_intervals", []))

    @property
    def peak_memory(self) -> Optional[int]:
        return self.data.get("peak_memory")

    @property
    def memory_kind(self) -> str:
        return self.data.get("memory_kind", "rss")

    @property
    def device(self) -> Optional[str]:
        return self.data.get("device")

    def precision_label(self) -> str:
        """What the run actually used: autocast dtypes seen and whether a GradScaler scaled the loss."""
        if self.spec.precision == FP32:
            return "fp32 (AMP off)"
        short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
        kinds = sorted({short.get(entry.split(":", 1)[1], entry.split(":", 1)[1]) for entry in self.data.get("autocast", [])})
        # apex O2/O3 cast the model's weights instead of opening autocast regions
        kinds += [f"{short.get(dtype, dtype)} model" for dtype in self.data.get("model_cast", [])]
        label = " + ".join(kinds) if kinds else "fp32"
        if self.data.get("grad_scaler"):
            # an after that keeps an apex import (apex.optimizers, ...) runs on the emulation too, but
            # its loss is scaled by a GradScaler: name the scaler that scaled
            calls = self.data.get("grad_scaler_calls") or {}
            apex = self.data.get("apex_loss_scale", self.apex_emulated and not calls.get("scale"))
            scalers = (["apex loss scale"] if apex else []) + (["GradScaler"] if calls.get("scale") or not apex else [])
            label += "".join(f" + {name}" for name in scalers)
        return label

    @property
    def steps_on_scaled_gradients(self) -> bool:
        """A GradScaler scaled the loss, but the gradients were never unscaled (no `step`/`unscale_`):
        the optimizer stepped on gradients multiplied by the loss scale."""
        calls = self.data.get("grad_scaler_calls") or {}
        return calls.get("scale", 0) > 0 and calls.get("step", 0) == 0 and calls.get("unscale_", 0) == 0

    @property
    def clips_scaled_gradients(self) -> bool:
        """Gradients were clipped while a GradScaler had scaled them and not yet unscaled them."""
        return self.data.get("clips_on_scaled_gradients", 0) > 0

    @property
    def skipped_steps(self) -> int:
        return len(self.data.get("skipped_steps", []))

    @property
    def every_step_skipped(self) -> bool:
        """Steps were attempted, and a GradScaler (or apex) skipped every one for inf/NaN gradients."""
        return self.steps == 0 and self.skipped_steps > 0

    @property
    def apex_emulated(self) -> bool:
        return bool(self.data.get("apex_emulation"))

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""


def _steady_median(intervals: List[float]) -> Optional[float]:
    warmup = min(5, len(intervals) // 5)
    steady = intervals[warmup:]
    return statistics.median(steady) if steady else None


@dataclass(frozen=True)
class TimeLimit:
    """When a run is stopped: after `total` seconds; or, without a total, when its first step takes
    longer than `first_step` seconds or it then goes `stall` seconds without a step."""

    total: Optional[float] = None
    first_step: Optional[float] = None
    stall: Optional[float] = None


FIRST_STEP_LIMIT = 900.0  # seconds to a first optimizer step (imports, data loading), before any baseline
STALL_LIMIT = 600.0  # seconds without a step once the run steps
DERIVED_FACTOR, DERIVED_MARGIN = 5.0, 120.0  # later runs: the baseline's own time to N steps, times 5, + 2 min


def time_limit(timeout: Optional[float], baseline: Optional[RunResult] = None) -> TimeLimit:
    """--timeout when given; else, once the baseline ran, a limit derived from its own time to its
    N steps; before that, limits on the time to the first step and between steps."""
    if timeout is not None:
        return TimeLimit(total=timeout)
    seconds = baseline.data.get("run_seconds") if baseline is not None else None
    if seconds:
        return TimeLimit(total=round(DERIVED_MARGIN + DERIVED_FACTOR * seconds))
    return TimeLimit(first_step=FIRST_STEP_LIMIT, stall=STALL_LIMIT)


class RunCancelled(Exception):
    """The run was killed because `cancel` was set (verify interrupted while runs went on in threads)."""


def execute(
    spec: RunSpec, workdir: str, name: str, timeout: Optional[float] = None, limit: Optional[TimeLimit] = None,
    cancel: Optional[threading.Event] = None,
) -> RunResult:
    """Run the harness on `spec` in a subprocess; the script's output goes to `workdir/logs/NAME.log`.
    Setting `cancel` (from another thread) kills the run's process group and raises RunCancelled."""
    limit = limit or TimeLimit(total=timeout)
    for sub in ("logs", "specs", "results", "scratch", "progress"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    log = os.path.join(workdir, "logs", f"{name}.log")
    result_path = os.path.join(workdir, "results", f"{name}.json")
    progress_path = os.path.join(workdir, "progress", name)
    scratch = os.path.join(workdir, "scratch", name)
    payload = asdict(spec)
    payload.update(result=result_path, scratch=scratch, exempt=[workdir], progress=progress_path)
    module = "ampmigrate.verify.harness"
    if spec.isolation == NAMESPACE:
        from ampmigrate.verify import isolation

        payload["namespace"] = isolation.plan(spec.protect, workdir, scratch)
        module = "ampmigrate.verify.isolation"  # mounts, then execs the harness
    spec_path = os.path.join(workdir, "specs", f"{name}.json")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1)
    from ampmigrate.verify.isolation import with_this_ampmigrate

    env = with_this_ampmigrate(dict(os.environ))  # the harness and the emulation's reporting are this ampmigrate's
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the user's project
    env.setdefault("PYTHONHASHSEED", "0")
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # "cuda" means the CPU, even on a GPU machine
    env.update(spec.env)
    watch_read, watch_write = os.pipe()  # the run's end reads EOF when verify is gone, however it ended
    env["AMPMIGRATE_VERIFY_WATCH_FD"] = str(watch_read)
    command = [sys.executable, "-m", module, spec_path]
    with open(log, "wb") as output:
        try:
            process = subprocess.Popen(
                command, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(watch_read,),
            )
        finally:
            os.close(watch_read)
        try:
            stopped = _wait(process, limit, progress_path, cancel)
        except BaseException:
            kill_group(process)
            raise
        finally:
            os.close(watch_write)
            kill_group(process)  # what the script left running (workers, children) goes with it
    if stopped:
        return RunResult(spec, {"status": "timeout", "error": {"type": "Timeout", "message": stopped}}, log, -1)
    try:
        with open(result_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        data = {
            "status": "died",
            "error": {"type": "died", "message": f"the run ended without a result (exit status {process.returncode}); see its log"},
        }
    data["isolation"] = spec.isolation
    if spec.isolation == NAMESPACE:
        from ampmigrate.verify import isolation

        data["written_files"] = isolation.written_files(payload["namespace"], spec.protect, spec.cwd)
        _explain_namespace_error(data)
    return RunResult(spec, data, log, process.returncode)


def _wait(process: subprocess.Popen, limit: TimeLimit, progress_path: str, cancel: Optional[threading.Event] = None) -> Optional[str]:
    """Wait for the run; a message when it had to be stopped for its time limit."""
    started = last_change = time.monotonic()
    steps = 0
    while True:
        try:
            process.wait(timeout=0.5)
            return None
        except subprocess.TimeoutExpired:
            pass
        if cancel is not None and cancel.is_set():
            raise RunCancelled(process.args)
        now = time.monotonic()
        if limit.total is not None and now - started > limit.total:
            return f"the run did not finish within {limit.total:g} s"
        current = _read_progress(progress_path)
        if current != steps:
            steps, last_change = current, now
        if steps == 0 and limit.first_step is not None and now - started > limit.first_step:
            return f"the run made no optimizer step within {limit.first_step:g} s (set --timeout to allow more)"
        if steps > 0 and limit.stall is not None and now - last_change > limit.stall:
            return f"the run made no optimizer step for {limit.stall:g} s after step {steps} (set --timeout to allow more)"


def _read_progress(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the run's process group (the run, its workers, its children) and reap the run."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


_NAMESPACE_HINTS = (
    ("Read-only file system", "under namespace isolation only the project, the working directory, the temporary folder "
     "and the home directory take writes (into the run's scratch layer); the rest of the file system is read-only"),
    ("Value too large for defined data type", "the file belongs to another user, so it cannot be copied into the "
     "run's scratch layer (EOVERFLOW)"),
)


def _explain_namespace_error(data: Dict[str, Any]) -> None:
    error = data.get("error") or {}
    text = f"{error.get('message', '')}\n{error.get('traceback', '')}"
    for marker, hint in _NAMESPACE_HINTS:
        if marker in text:
            error["message"] = f"{error.get('message', '')} ({hint})"
            return


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C (runs killed, temporary folder removed)."""


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = {}
    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None:
            previous[number] = signal.signal(number, raise_terminated)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


# ------------------------------------------------------------------------------ the verify folder
def new_workdir() -> str:
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    with open(os.path.join(workdir, _OWNER_FILE), "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))
    return workdir


def remove_workdir(path: str) -> None:
    """Remove a verify folder, including overlay work folders left with mode 000."""

    def allow_and_retry(function, failed, _):
        parent = os.path.dirname(failed)
        for folder in (parent, failed):
            try:
                os.chmod(folder, 0o700)
            except OSError:
                pass
        if function is os.rmdir or os.path.isdir(failed):
            shutil.rmtree(failed, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                function(failed)

    shutil.rmtree(path, onerror=allow_and_retry)


def stale_workdirs(folder: Optional[str] = None) -> Tuple[List[str], List[str]]:
    """Verify folders in the temporary folder: (those no running verify owns, those in use)."""
    folder = folder or tempfile.gettempdir()
    stale, in_use = [], []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return stale, in_use
    for name in names:
        path = os.path.join(folder, name)
        if not name.startswith(WORKDIR_PREFIX) or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            with open(os.path.join(path, _OWNER_FILE), encoding="utf-8") as handle:
                owner = int(handle.read().strip())
        except (OSError, ValueError):
            owner = None
        (in_use if owner is not None and owner != os.getpid() and _alive(owner) else stale).append(path)
    return stale, in_use


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
