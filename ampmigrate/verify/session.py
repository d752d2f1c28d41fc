"""One verification: migrate, run K before and K after runs (paired by seed), decide.

Exit status: 0 equivalent, 1 not equivalent, 2 could not run (a script that crashed, a script
that never calls backward, a before that is not finite, ...).

When the migration repairs GradScaler protocol bugs (AMP3xx), a third program, the before with
only those repairs (`bugfix.py`), runs K times too: the precision migration is judged between it
and the after, and the repair's own effect is reported apart. A before that uses apex runs
unmodified on the apex emulation (`apex_emulation/`), which every run finds first on its import
path; the after runs see apex as it is today (no `apex.amp`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional

from ampmigrate.config import Settings
from ampmigrate.verify.batch import plan_jobs, run_all
from ampmigrate.verify.bugfix import BugFixProgram, bug_fix_program
from ampmigrate.verify.harness import APEX_EMULATION
from ampmigrate.verify.project import MigratedProject, migrate_copy
from ampmigrate.verify.isolation import choose_isolation, protected_folders
from ampmigrate.verify.runner import (
    AS_WRITTEN, FP32, REDIRECT, RunResult, RunSpec, new_workdir, remove_workdir, termination_as_interrupt, time_limit,
)
from ampmigrate.verify.stats import DEFAULT, Comparison, ComparisonError, compare

EQUIVALENT, NOT_EQUIVALENT, COULD_NOT_RUN = 0, 1, 2
BASELINE_BEFORE, BASELINE_FIXED, BASELINE_FP32 = "before", "fixed before", "fp32"


@dataclass(frozen=True)
class Options:
    script: str
    script_args: List[str] = field(default_factory=list)
    after: Optional[str] = None  # compare SCRIPT with this file instead of migrating
    root: Optional[str] = None  # the project to migrate (default: the script's folder)
    steps: int = 200
    seed: int = 0
    device: str = "auto"
    runs: int = DEFAULT.runs  # K runs per side, seeds S .. S+K-1
    tolerance: float = DEFAULT.margin  # the equivalence margin of the final loss (relative)
    timeout: Optional[float] = None  # seconds per run
    keep: bool = False  # keep the temporary folder (copy, logs) even when equivalent
    isolation: str = "auto"  # auto | namespace | redirect (isolation.choose_isolation)
    jobs: Optional[int] = None  # runs at a time (default: one per core on the CPU)


@dataclass
class Outcome:
    options: Options
    workdir: str
    exit_code: int = COULD_NOT_RUN
    problem: Optional[str] = None  # why it could not run (exit 2)
    failed_run: Optional[RunResult] = None  # the run whose crash is the problem
    baseline_kind: str = BASELINE_BEFORE  # what the after is judged against
    before_runs: List[RunResult] = field(default_factory=list)
    fixed_runs: List[RunResult] = field(default_factory=list)  # the before with only the protocol fixes
    reference_runs: List[RunResult] = field(default_factory=list)  # what the after is compared with
    after_runs: List[RunResult] = field(default_factory=list)
    comparison: Optional[Comparison] = None  # reference runs vs. after runs
    reasons: List[str] = field(default_factory=list)  # why not equivalent (exit 1)
    bug_fix: Optional[BugFixProgram] = None
    bug_fix_comparison: Optional[Comparison] = None  # before runs vs. fixed-before runs
    project: Optional[MigratedProject] = None
    notes: List[str] = field(default_factory=list)
    kept: bool = False
    isolation: str = REDIRECT  # what the runs used: NAMESPACE or REDIRECT

    @property
    def verdict(self) -> str:
        return {EQUIVALENT: "equivalent", NOT_EQUIVALENT: "not equivalent"}.get(self.exit_code, "could not run")

    # The first run of each side (seed S), for the single-run rows of the report.
    @property
    def before_result(self) -> Optional[RunResult]:
        return self.before_runs[0] if self.before_runs else None

    @property
    def baseline(self) -> Optional[RunResult]:
        return self.reference_runs[0] if self.reference_runs else None

    @property
    def after(self) -> Optional[RunResult]:
        return self.after_runs[0] if self.after_runs else None

    @property
    def apex_emulated(self) -> bool:
        return any(run.apex_emulated for run in self.before_runs)


class _Stop(Exception):
    def __init__(self, problem: str, run: Optional[RunResult] = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.run = run


class _NotEquivalent(Exception):
    """A verdict that needs no comparison of curves (every step of the after was skipped)."""


def _is_apex(module: Optional[str]) -> bool:
    return bool(module) and module.split(".")[0] == "apex"


def run_verification(
    options: Options, settings: Settings, progress: Callable[[str], None] = lambda _: None,
    live: Callable[[str], None] = lambda _: None,
) -> Outcome:
    """`progress` gets a line per stage; `live` the runs' step counts while they run."""
    workdir = new_workdir()
    outcome = Outcome(options, workdir)
    try:
        with termination_as_interrupt():  # SIGTERM/SIGHUP: runs killed, folder removed, as for Ctrl-C
            _verify(options, settings, outcome, progress, live)
    except KeyboardInterrupt:
        remove_workdir(workdir)
        raise
    except _Stop as stop:
        outcome.exit_code = COULD_NOT_RUN
        outcome.problem = stop.problem
        outcome.failed_run = stop.run
    except _NotEquivalent as verdict:
        outcome.exit_code = NOT_EQUIVALENT
        outcome.reasons.append(str(verdict))
    except BaseException:
        remove_workdir(workdir)
        raise
    if outcome.exit_code == EQUIVALENT and not options.keep:
        remove_workdir(workdir)
    else:
        outcome.kept = True
    return outcome


@dataclass
class _Side:
    label: str
    script: str
    path_map: Dict[str, str]
    precision: str = AS_WRITTEN
    apex: str = "full"  # the emulation as apex was (before) or as it is now (after)


def _verify(options: Options, settings: Settings, outcome: Outcome, progress, live) -> None:
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
    # Also for a given --after: its reference is the before with the protocol bugs `fix` would repair repaired.
    outcome.bug_fix = bug_fix_program(
        root, os.path.join(outcome.workdir, "fixed", os.path.basename(root) or "root"), settings, ignore=options.after and after_script
    )
    runs = options.runs
    jobs = plan_jobs(options.jobs, 3 * runs if outcome.bug_fix else 2 * runs, options.device)
    limits = {"first": time_limit(options.timeout)}  # then one derived from the baseline's own time

    def spec(side: _Side, offset: int) -> RunSpec:
        return RunSpec(
            label=side.label, script=side.script, args=list(options.script_args), cwd=cwd, steps=options.steps,
            seed=options.seed + offset, seed_offset=offset, device=options.device, precision=side.precision,
            protect=protect, path_map=side.path_map, isolation=outcome.isolation,
            env={"AMPMIGRATE_APEX_EMULATION": side.apex}, python_path=[APEX_EMULATION],
        )

    def launch(sides: List[_Side], offsets: range) -> List[List[RunResult]]:
        specs = [(spec(side, k), f"{side.label.replace(' ', '-')}-{k}") for k in offsets for side in sides]
        count = len(specs)
        progress(f"running {count} run{'s' if count != 1 else ''} ({', '.join(s.label for s in sides)}; "
                 f"seed{'s' if len(offsets) > 1 else ''} {', '.join(str(options.seed + k) for k in offsets)}), {jobs} at a time ...")
        results = run_all(specs, outcome.workdir, jobs=jobs, limit=limits.get("derived") or limits["first"], live=live)
        done = [r for r in results if not r.failed]
        if done:
            seconds = max(r.data.get("run_seconds", 0.0) for r in done)
            progress(f"  {len(done)} of {count} ran their steps (longest {seconds:.1f} s)")
        return [results[i::len(sides)] for i in range(len(sides))]

    before_side = _Side("before", script, {})
    after_side = _Side("after", after_script, path_map if not options.after else {}, apex="current")
    fixed = outcome.bug_fix
    sides = [before_side] + ([_Side("fixed before", fixed.project.in_copy(script), {root: fixed.project.copy})] if fixed else [])
    sides.append(after_side)

    # Seed S of every side first: a script that cannot run stops here, before K-1 more runs.
    first = dict(zip([s.label for s in sides], launch(sides, range(0, 1))))
    before = first["before"][0]
    if before.failed and _is_apex(before.missing_module):
        # An apex API the emulation does not cover: the reference is the after script in fp32.
        outcome.baseline_kind = BASELINE_FP32
        outcome.notes.append(
            f"the before script cannot run ({before.error.get('type')}: {before.error.get('message')}); the reference is "
            "the after script with mixed precision switched off (fp32), which apex itself approximated"
        )
        sides[0] = _Side("baseline (fp32)", after_script, after_side.path_map, FP32, apex="current")
        first[sides[0].label] = launch(sides[:1], range(0, 1))[0]
    _collect(outcome, sides, first)
    for side in sides:
        _check_ran(side.label, first[side.label][0])
    limits["derived"] = time_limit(options.timeout, first[sides[0].label][0])
    rest = dict(zip([s.label for s in sides], launch(sides, range(1, runs)))) if runs > 1 else {s.label: [] for s in sides}
    groups = {s.label: first[s.label] + rest[s.label] for s in sides}
    _collect(outcome, sides, groups)
    for side in sides:
        for run in groups[side.label][1:]:
            _check_ran(side.label, run)
    _note_unmigrated(outcome)
    _judge(outcome)


def _collect(outcome: Outcome, sides: List[_Side], groups: Dict[str, List[RunResult]]) -> None:
    outcome.before_runs = groups[sides[0].label]
    outcome.after_runs = groups["after"]
    if "fixed before" in groups:
        outcome.fixed_runs = groups["fixed before"]
        outcome.baseline_kind = BASELINE_FIXED
    outcome.reference_runs = outcome.fixed_runs or outcome.before_runs
    note = next((n for n in outcome.notes if "apex emulation" in n), None)
    if outcome.apex_emulated and note is None:
        modules = sorted({m for run in outcome.before_runs for m in run.data.get("apex_emulation", [])})
        outcome.notes.append(f"the before ran unmodified on ampmigrate's apex emulation ({', '.join(modules)}), not on NVIDIA apex")


def _check_ran(label: str, run: RunResult) -> None:
    if label == "after":
        if run.every_step_skipped:
            raise _NotEquivalent(
                f"every optimizer step of the after run with seed {run.spec.seed} was skipped: its loss scaler found "
                f"inf/NaN gradients in all {run.skipped_steps} iterations, so the after never trains"
            )
        _require_no_apex(run)
    what = {"before": "the before script", "after": "the after script", "fixed before": "the before with its protocol fixes",
            "baseline (fp32)": "the fp32 baseline (the after script with AMP off)"}.get(label, label)
    if run.every_step_skipped:
        raise _Stop(f"{what} never trains: every one of its {run.skipped_steps} optimizer steps was skipped for inf/NaN gradients", run)
    _require_ran(run, f"{what} (seed {run.spec.seed})")


def _note_unmigrated(outcome: Outcome) -> None:
    unmigrated = sorted({m for run in outcome.after_runs for m in run.data.get("unmigrated_modules") or []})
    if unmigrated:
        outcome.notes.append(
            "the after run imported modules from the original project, not the migrated copy: " + ", ".join(unmigrated)
        )


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
_CLIPS_SCALED = (
    "clips gradients that a GradScaler scaled and has not unscaled (no scaler.unscale_ before the clip): "
    "the threshold applies to gradients multiplied by the loss scale"
)


def _losses(runs: List[RunResult]) -> List[List[Optional[float]]]:
    return [run.losses for run in runs]


def _judge(outcome: Outcome) -> None:
    criterion = replace(DEFAULT, runs=outcome.options.runs, margin=outcome.options.tolerance)
    try:
        outcome.comparison = compare(_losses(outcome.reference_runs), _losses(outcome.after_runs), criterion)
    except ComparisonError as exc:
        raise _Stop(str(exc)) from None
    outcome.reasons.extend(outcome.comparison.reasons)
    # Protocol errors the curve may not show (Adam is nearly blind to a constant gradient scale).
    for flag, message in (("steps_on_scaled_gradients", _SCALED_GRADIENTS), ("clips_scaled_gradients", _CLIPS_SCALED)):
        if any(getattr(run, flag) for run in outcome.after_runs):
            outcome.reasons.append(f"the after run {message}")
        if any(getattr(run, flag) for run in outcome.reference_runs):
            outcome.notes.append(f"the {outcome.reference_runs[0].spec.label} run {message}")
    if outcome.fixed_runs:
        try:
            outcome.bug_fix_comparison = compare(_losses(outcome.before_runs), _losses(outcome.fixed_runs), criterion)
        except ComparisonError as exc:
            outcome.notes.append(f"the bug fix's effect could not be measured: {exc}")
    outcome.exit_code = EQUIVALENT if not outcome.reasons else NOT_EQUIVALENT


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
