"""One verification: migrate, run before / after / noise-floor runs, compare.

Exit status: 0 equivalent, 1 not equivalent, 2 could not run (a script that crashed, a script
that never calls backward, a baseline that is not finite, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, List, Optional

from ampmigrate.config import Settings
from ampmigrate.verify.project import MigratedProject, migrate_copy
from ampmigrate.verify.isolation import choose_isolation, protected_folders
from ampmigrate.verify.runner import (
    AS_WRITTEN, FP32, REDIRECT, RunResult, RunSpec, execute, new_workdir, remove_workdir, termination_as_interrupt,
    time_limit,
)
from ampmigrate.verify.stats import DEFAULT_TOLERANCE, Comparison, ComparisonError, compare

EQUIVALENT, NOT_EQUIVALENT, COULD_NOT_RUN = 0, 1, 2
BASELINE_BEFORE, BASELINE_FP32 = "before", "fp32"


@dataclass(frozen=True)
class Options:
    script: str
    script_args: List[str] = field(default_factory=list)
    after: Optional[str] = None  # compare SCRIPT with this file instead of migrating
    root: Optional[str] = None  # the project to migrate (default: the script's folder)
    steps: int = 200
    seed: int = 0
    device: str = "auto"
    runs: int = 3  # baseline runs (seeds) for the noise floor, the seed-S baseline included
    tolerance: float = DEFAULT_TOLERANCE
    timeout: Optional[float] = None  # seconds per run
    keep: bool = False  # keep the temporary folder (copy, logs) even when equivalent
    isolation: str = "auto"  # auto | namespace | redirect (sandboxing.choose_isolation)


@dataclass
class Outcome:
    options: Options
    workdir: str
    exit_code: int = COULD_NOT_RUN
    problem: Optional[str] = None  # why it could not run (exit 2)
    failed_run: Optional[RunResult] = None  # the run whose crash is the problem
    baseline_kind: str = BASELINE_BEFORE
    before_result: Optional[RunResult] = None  # the before run as written (also when it failed)
    baseline: Optional[RunResult] = None  # what the after is compared with (seed S)
    after: Optional[RunResult] = None
    noise: List[RunResult] = field(default_factory=list)
    comparison: Optional[Comparison] = None
    project: Optional[MigratedProject] = None
    notes: List[str] = field(default_factory=list)
    kept: bool = False
    isolation: str = REDIRECT  # what the runs used: NAMESPACE or REDIRECT

    @property
    def verdict(self) -> str:
        return {EQUIVALENT: "equivalent", NOT_EQUIVALENT: "not equivalent"}.get(self.exit_code, "could not run")


class _Stop(Exception):
    def __init__(self, problem: str, run: Optional[RunResult] = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.run = run


def _is_apex(module: Optional[str]) -> bool:
    return bool(module) and module.split(".")[0] == "apex"


def run_verification(options: Options, settings: Settings, progress: Callable[[str], None] = lambda _: None) -> Outcome:
    workdir = new_workdir()
    outcome = Outcome(options, workdir)
    try:
        with termination_as_interrupt():  # SIGTERM/SIGHUP: runs killed, folder removed, as for Ctrl-C
            _verify(options, settings, outcome, progress)
    except KeyboardInterrupt:
        remove_workdir(workdir)
        raise
    except _Stop as stop:
        outcome.exit_code = COULD_NOT_RUN
        outcome.problem = stop.problem
        outcome.failed_run = stop.run
    except BaseException:
        remove_workdir(workdir)
        raise
    if outcome.exit_code == EQUIVALENT and not options.keep:
        remove_workdir(workdir)
    else:
        outcome.kept = True
    return outcome


def _verify(options: Options, settings: Settings, outcome: Outcome, progress: Callable[[str], None]) -> None:
    script = os.path.realpath(options.script)
    root = os.path.realpath(options.root or os.path.dirname(script))
    cwd = os.getcwd()
    if not (script + os.sep).startswith(root + os.sep):
        raise _Stop(f"{options.script} is not inside the project root {root}")
    try:
        outcome.isolation = choose_isolation(options.isolation, outcome.notes)
    except ValueError as exc:
        raise _Stop(str(exc)) from None
    after_script, path_map = _prepare_after(options, settings, outcome, script, root, progress)
    # folders whose files the runs must not change
    protect = protected_folders([root, cwd] + ([os.path.dirname(after_script)] if options.after else []))
    limits = {}  # the time limit of each run: the first one's, then one derived from the baseline

    def spec(label: str, path: str, seed: int, precision: str = AS_WRITTEN, mapped: bool = False) -> RunSpec:
        return RunSpec(
            label=label,
            script=path,
            args=list(options.script_args),
            cwd=cwd,
            steps=options.steps,
            seed=seed,
            seed_offset=seed - options.seed,
            device=options.device,
            precision=precision,
            protect=protect,
            path_map=path_map if mapped else {},
            isolation=outcome.isolation,
        )

    def launch(run_spec: RunSpec, name: str) -> RunResult:
        progress(f"running {run_spec.label} (seed {run_spec.seed}) ...")
        result = execute(run_spec, outcome.workdir, name, limit=limits.get("derived") or time_limit(options.timeout))
        if not result.failed:
            seconds = result.data.get("run_seconds", 0.0)
            progress(f"  {result.steps} steps in {seconds:.1f} s")
        return result

    before = launch(spec("before", script, options.seed), "before")
    outcome.before_result = before
    mapped_after = not options.after
    baseline_spec = spec("before", script, options.seed)
    if before.failed and _is_apex(before.missing_module):
        # apex.amp no longer exists anywhere: the reference is the after script in fp32.
        outcome.baseline_kind = BASELINE_FP32
        outcome.notes.append(
            f"the before script cannot run ({before.error.get('type')}: {before.error.get('message')}); "
            "the baseline is the after script with mixed precision switched off (fp32), the reference apex approximated"
        )
        baseline_spec = spec("baseline (fp32)", after_script, options.seed, FP32, mapped_after)
        baseline = launch(baseline_spec, "baseline-fp32")
        _require_no_apex(baseline)
        _require_ran(baseline, "the fp32 baseline (the after script with AMP off)")
    else:
        _require_ran(before, "the before script")
        baseline = before
    outcome.baseline = baseline
    limits["derived"] = time_limit(options.timeout, baseline)

    after = launch(spec("after", after_script, options.seed, mapped=mapped_after), "after")
    outcome.after = after
    _require_no_apex(after)
    _require_ran(after, "the after script")
    unmigrated = after.data.get("unmigrated_modules") or []
    if unmigrated:
        outcome.notes.append(
            "the after run imported modules from the original project, not the migrated copy: " + ", ".join(unmigrated)
        )

    for offset in range(1, options.runs):
        noise_spec = replace(baseline_spec, label=f"{baseline_spec.label} for the noise floor", seed=options.seed + offset, seed_offset=offset)
        result = launch(noise_spec, f"noise-{offset}")
        _require_ran(result, f"the baseline with seed {options.seed + offset}")
        outcome.noise.append(result)

    _judge(outcome, options.tolerance)


def _prepare_after(options: Options, settings: Settings, outcome: Outcome, script: str, root: str, progress):
    """The after script (given, or SCRIPT in a migrated copy of the root) and the sys.path mapping."""
    if options.after:
        return os.path.realpath(options.after), {}
    project = migrate_copy(root, os.path.join(outcome.workdir, "project", os.path.basename(root) or "root"), settings)
    outcome.project = project
    if not project.changed:
        outcome.notes.append("the migration changed nothing in the project: before and after run the same code")
    for error in project.errors:
        outcome.notes.append(f"not migrated: {error}")
    progress(f"migrated {len(project.changed)} file(s) of {root} into a temporary copy ({project.fixed} fixes)")
    return project.in_copy(script), {root: project.copy}


_SCALED_GRADIENTS = (
    "scales the loss with a GradScaler but never unscales the gradients (no scaler.step or scaler.unscale_): "
    "the optimizer steps on gradients multiplied by the loss scale"
)


def _judge(outcome: Outcome, tolerance: float) -> None:
    baseline, after = outcome.baseline, outcome.after
    try:
        outcome.comparison = compare(
            baseline.losses, after.losses, [run.losses for run in outcome.noise], tolerance=tolerance
        )
    except ComparisonError as exc:
        raise _Stop(str(exc)) from None
    # A protocol error the curve may not show (Adam is nearly blind to a constant gradient scale).
    if after.steps_on_scaled_gradients:
        outcome.comparison.reasons.append(f"the after run {_SCALED_GRADIENTS}")
    if baseline.steps_on_scaled_gradients:
        outcome.notes.append(f"the {baseline.spec.label} run {_SCALED_GRADIENTS}")
    outcome.exit_code = EQUIVALENT if outcome.comparison.equivalent else NOT_EQUIVALENT


def _require_no_apex(run: RunResult) -> None:
    if run.failed and _is_apex(run.missing_module):
        raise _Stop(
            "the after script still imports apex, which no current stack has: the migration could not replace "
            "it (see `ampmigrate check` for the findings it left)",
            run,
        )


def _require_ran(run: RunResult, what: str) -> None:
    """A run that crashed or never trained cannot be compared: stop with exit 2."""
    if run.failed:
        error = run.error
        message = error.get("message") or run.status
        raise _Stop(f"{what} failed: {error.get('type', 'error')}: {message}", run)
    if run.data.get("backward_calls", 0) == 0 and run.spec.instrument:
        raise _Stop(
            f"{what} never called backward() on a scalar loss, so there is no loss curve to compare; "
            "verify needs a training loop that calls loss.backward() (directly or through GradScaler.scale)",
            run,
        )
    if run.steps == 0:
        raise _Stop(
            f"{what} called backward() but never stepped an optimizer (torch.optim.Optimizer.step); "
            "verify counts optimizer steps",
            run,
        )
