"""The parent side of one run: a subprocess of the harness, its log, its result."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

AS_WRITTEN, FP32 = "as-written", "fp32"


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
        label = " + ".join(kinds) if kinds else "fp32"
        if self.data.get("grad_scaler"):
            label += " + apex loss scale" if self.apex_emulated else " + GradScaler"
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


def execute(spec: RunSpec, workdir: str, name: str, timeout: Optional[float] = None) -> RunResult:
    """Run the harness on `spec` in a subprocess; the script's output goes to `workdir/logs/NAME.log`."""
    for sub in ("logs", "specs", "results", "scratch", "progress"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    log = os.path.join(workdir, "logs", f"{name}.log")
    result_path = os.path.join(workdir, "results", f"{name}.json")
    payload = asdict(spec)
    payload.update(
        result=result_path,
        scratch=os.path.join(workdir, "scratch", name),
        exempt=[workdir],
        progress=os.path.join(workdir, "progress", name),  # the step count so far (the live counter)
    )
    spec_path = os.path.join(workdir, "specs", f"{name}.json")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1)
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the user's project
    env.setdefault("PYTHONHASHSEED", "0")
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # "cuda" means the CPU, even on a GPU machine
    env.update(spec.env)
    command = [sys.executable, "-m", "ampmigrate.verify.harness", spec_path]
    returncode = 0
    with open(log, "wb") as output:
        try:
            completed = subprocess.run(
                command, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, timeout=timeout
            )
            returncode = completed.returncode
        except subprocess.TimeoutExpired:
            return RunResult(spec, {"status": "timeout", "error": {"type": "Timeout", "message": f"the run did not finish within {timeout:g} s"}}, log, -1)
    try:
        with open(result_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        data = {
            "status": "died",
            "error": {"type": "died", "message": f"the run ended without a result (exit status {returncode}); see its log"},
        }
    return RunResult(spec, data, log, returncode)
