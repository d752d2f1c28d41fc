"""What `verify` shows: a table, a plot of the two curves, the verdict; and its JSON form."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ampmigrate.verify.runner import RunResult
from ampmigrate.verify.session import BASELINE_FIXED, BASELINE_FP32, COULD_NOT_RUN, EQUIVALENT, Outcome
from ampmigrate.verify.stats import Comparison, ema, segment_means
from ampmigrate.verify.termplot import line_chart

BEFORE_STYLE, AFTER_STYLE, NOISE_STYLE = "cyan", "magenta", "bright_black"


def baseline_name(outcome: Outcome) -> str:
    return {BASELINE_FP32: "baseline (fp32)", BASELINE_FIXED: "before + fixes"}.get(outcome.baseline_kind, "before")


def smoothed(run: RunResult, steps: int) -> List[float]:
    """A run's curve for the plots: an EMA over a twentieth of the run."""
    return ema(run.losses[:steps], max(2, steps // 20))


def mean_curve(curves: List[List[float]]) -> List[float]:
    return [sum(values) / len(values) for values in zip(*curves)]


def render(outcome: Outcome, console: Console) -> None:
    if outcome.exit_code == COULD_NOT_RUN:
        _render_failure(outcome, console)
        return
    console.print(_title(outcome))
    comparison = outcome.comparison
    if comparison is not None:
        console.print(_table(outcome))
        steps = comparison.steps
        reference = [smoothed(run, steps) for run in outcome.reference_runs]
        after = [smoothed(run, steps) for run in outcome.after_runs]
        series = [(f"{baseline_name(outcome)}, each seed" if i == 0 else "", curve, NOISE_STYLE) for i, curve in enumerate(reference)]
        series += [(f"{baseline_name(outcome)} (mean of {len(reference)})", mean_curve(reference), BEFORE_STYLE),
                   (f"after (mean of {len(after)})", mean_curve(after), AFTER_STYLE)]
        width = max(30, min(72, console.width - 14))
        console.print(line_chart(series, width=width, height=12))
        console.print()
    _render_bug_fix(outcome, console)
    for note in outcome.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if outcome.exit_code == EQUIVALENT:
        console.print(Text("EQUIVALENT", style="bold green"), Text(f"— {_criterion(outcome)}"))
    else:
        console.print(Text("NOT EQUIVALENT", style="bold red"))
        for reason in outcome.reasons:
            console.print(f"  - {reason}")
    if outcome.kept:
        console.print(Text(f"logs and the migrated copy: {outcome.workdir}", style="dim"))


def _title(outcome: Outcome) -> Text:
    options = outcome.options
    after = options.after or "the migrated copy"
    run = outcome.after or outcome.before_result
    device = run.device if run else options.device
    mapped = " (CUDA mapped to CPU)" if run and run.data.get("cuda_mapped") else ""
    title = Text.assemble(("ampmigrate verify ", "bold"), f"{options.script} vs. {after}\n")
    seeds = f"seeds {options.seed}-{options.seed + options.runs - 1}" if options.runs > 1 else f"seed {options.seed}"
    details = f"device {device}{mapped}, {options.steps} steps, {options.runs} runs per side ({seeds})"
    if run and run.data.get("torch"):
        details += f", torch {run.data['torch']}"
    details += f", isolation {outcome.isolation}"
    title.append(details, style="dim")
    project = outcome.project
    if project is not None:
        changed = ", ".join(f"{path} ({count} fix{'es' if count != 1 else ''})" for path, count in sorted(project.changed.items()))
        title.append(f"\nmigrated: {changed or 'nothing'}", style="dim")
        if project.remaining:
            title.append(f"; {len(project.remaining)} finding(s) left unfixed", style="dim")
    return title


def _final_cell(runs: List[RunResult], comparison: Comparison, index: int) -> str:
    finals = [segment_means(run.losses[: comparison.steps], comparison.bounds)[index] for run in runs]
    centre = sum(finals) / len(finals)
    spread = max(finals) - min(finals)
    return f"{centre:.4f} ± {spread / 2:.4f}"


def _table(outcome: Outcome) -> Table:
    reference, after, comparison = outcome.reference_runs, outcome.after_runs, outcome.comparison
    criterion = comparison.criterion
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column(baseline_name(outcome), style=BEFORE_STYLE, justify="right", no_wrap=True)
    table.add_column("after", style=AFTER_STYLE, justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_row("precision", reference[0].precision_label(), after[0].precision_label(), "")
    skipped = [sum(run.skipped_steps for run in runs) for runs in (reference, after)]
    table.add_row(
        "steps run (each)",
        f"{reference[0].steps}" + (f" (+{skipped[0]} skipped)" if skipped[0] else ""),
        f"{after[0].steps}" + (f" (+{skipped[1]} skipped)" if skipped[1] else ""),
        f"{comparison.runs} runs per side",
    )
    table.add_row(
        f"final loss (last {100 // len(comparison.bounds)}%)",
        _final_cell(reference, comparison, -1),
        _final_cell(after, comparison, -1),
        f"{comparison.final_difference:+.2%}",
    )
    table.add_row(
        "  difference, 90% CI",
        "",
        f"[{comparison.final_low:+.3g}, {comparison.final_high:+.3g}]",
        f"margin ±{comparison.final_margin:.3g}",
    )
    table.add_row(
        "curve (std. errors)",
        "",
        f"max {comparison.band_ratio:.2f}, rms {comparison.rms_ratio:.2f}",
        f"limits {criterion.band:g}, {criterion.rms_band:g}",
    )
    cpu = (after[0].device or "") == "cpu"
    before_time, after_time = _median([r.median_step_time for r in reference]), _median([r.median_step_time for r in after])
    speedup = f"{before_time / after_time:.2f}x" + ("" if cpu else " speedup") if before_time and after_time else ""
    table.add_row("median step time", _seconds(before_time), _seconds(after_time), speedup)
    memory_label = "peak GPU memory" if after[0].memory_kind == "cuda" else "peak memory (RSS)"
    before_memory, after_memory = reference[0].peak_memory, after[0].peak_memory
    saving = ""
    if before_memory and after_memory:
        saving = f"{(after_memory - before_memory) / before_memory:+.1%}"
    table.add_row(memory_label, _bytes(before_memory), _bytes(after_memory), saving)
    if cpu:
        table.add_row("", "", "", Text("CPU: says nothing about a GPU", style="dim"))
    verdict = Text("equivalent", style="bold green") if outcome.exit_code == EQUIVALENT else Text("NOT equivalent", style="bold red")
    table.add_row("verdict", "", verdict, "")
    return table


def _median(values: List[Optional[float]]) -> Optional[float]:
    known = sorted(v for v in values if v)
    return known[len(known) // 2] if known else None


def _criterion(outcome: Outcome) -> str:
    comparison = outcome.comparison
    criterion = comparison.criterion
    return (
        f"{comparison.runs} runs per side, paired by seed: the after's mean loss stays within the "
        f"{baseline_name(outcome)} runs' seed-to-seed spread along the run (at most {criterion.band:g}, "
        f"rms {criterion.rms_band:g} standard errors) and the final losses are equivalent within "
        f"±{comparison.final_margin:.4g} (two one-sided tests, 5% each)"
    )


def bug_fix_lines(outcome: Outcome) -> List[str]:
    """The protocol fixes the migration made, and what they did to the training, in words."""
    program = outcome.bug_fix
    if program is None:
        return []
    lines = ["GradScaler protocol bugs `fix` repairs in the before (the after is judged against the before with only these repairs):"]
    for fix in program.fixes:
        lines.append(f"  {fix.code} {fix.path}:{fix.row}: {fix.change} ({fix.message})")
    effect = outcome.bug_fix_comparison
    if effect is not None:
        first, last = effect.steps_of(len(effect.bounds) - 1)
        change = "changed the training beyond seed-to-seed variation" if effect.reasons else "changed the training no more than another seed would"
        lines.append(
            f"  effect: final loss (steps {first}-{last}, mean of {effect.runs} seeds) {effect.final_before:.4f} before, "
            f"{effect.final_after:.4f} with the fix ({effect.final_difference:+.1%}); the fix {change}"
        )
    return lines


def _render_bug_fix(outcome: Outcome, console: Console) -> None:
    for index, line in enumerate(bug_fix_lines(outcome)):
        console.print(Text(line, style="bold" if index == 0 else ""))
    if outcome.bug_fix is not None:
        console.print()


def _render_failure(outcome: Outcome, console: Console) -> None:
    console.print(Text("could not verify: ", style="bold red") + Text(outcome.problem or "unknown error"))
    run = outcome.failed_run
    if run is not None:
        trace = run.error.get("traceback")
        tail = run.log_tail()
        if trace:
            console.print(Panel(Text(trace.rstrip()), title=f"traceback of the {run.spec.label} run", border_style="red"))
        elif tail.strip():
            console.print(Panel(Text(tail.rstrip()), title=f"end of the {run.spec.label} run's log", border_style="red"))
        console.print(Text(f"log of the {run.spec.label} run: {run.log}", style="dim"))
    for note in outcome.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if outcome.kept:
        console.print(Text(f"logs and the migrated copy: {outcome.workdir}", style="dim"))


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _bytes(value: Optional[int]) -> str:
    if not value:
        return "-"
    return f"{value / 2**20:.0f} MiB" if value >= 2**20 else f"{value / 1024:.0f} KiB"


# ------------------------------------------------------------------------------ JSON
def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def _run_json(run: Optional[RunResult]) -> Optional[Dict[str, Any]]:
    if run is None:
        return None
    return {
        "label": run.spec.label,
        "script": run.spec.script,
        "seed": run.spec.seed,
        "precision_mode": run.spec.precision,
        "precision": run.precision_label(),
        "status": run.status,
        "device": run.device,
        "cuda_mapped_to_cpu": run.data.get("cuda_mapped"),
        "steps": run.steps,
        "skipped_steps": run.data.get("skipped_steps", []),
        "clips_on_scaled_gradients": run.data.get("clips_on_scaled_gradients", 0),
        "apex_emulation": run.data.get("apex_emulation", []),
        "losses": [_finite_or_none(v) for v in run.losses],
        "median_step_time_s": run.median_step_time,
        "peak_memory_bytes": run.peak_memory,
        "memory_kind": run.memory_kind,
        "written_files": run.data.get("written_files", []),
        "error": run.data.get("error"),
        "log": run.log,
        "torch": run.data.get("torch"),
    }


def _comparison_json(comparison: Optional[Comparison]) -> Optional[Dict[str, Any]]:
    if comparison is None:
        return None
    criterion = comparison.criterion
    return {
        "runs_per_side": comparison.runs,
        "steps": comparison.steps,
        "stretches": comparison.bounds,
        "mean_loss_reference": comparison.before,
        "mean_loss_after": [_finite_or_none(v) for v in comparison.after],
        "seed_spread": comparison.spread,
        "band_ratios": [_finite_or_none(v) for v in comparison.band_ratios],
        "band_ratio_max": _finite_or_none(comparison.band_ratio),
        "band_ratio_rms": _finite_or_none(comparison.rms_ratio),
        "final_loss_reference": comparison.final_before,
        "final_loss_after": _finite_or_none(comparison.final_after),
        "final_relative_difference": _finite_or_none(comparison.final_difference),
        "final_difference_interval_90": [_finite_or_none(comparison.final_low), _finite_or_none(comparison.final_high)],
        "final_margin": comparison.final_margin,
        "criterion": {"band": criterion.band, "rms_band": criterion.rms_band, "margin": criterion.margin,
                      "spread_margin": criterion.spread_margin, "stretches": criterion.segments},
        "reasons": comparison.reasons,
    }


def to_json(outcome: Outcome) -> Dict[str, Any]:
    data: Dict[str, Any] = {
        "verdict": outcome.verdict,
        "exit_code": outcome.exit_code,
        "problem": outcome.problem,
        "reasons": outcome.reasons,
        "baseline": {BASELINE_FP32: "fp32 after", BASELINE_FIXED: "before with protocol fixes"}.get(outcome.baseline_kind, "before"),
        "apex_emulation": outcome.apex_emulated,
        "notes": outcome.notes,
        "isolation": outcome.isolation,
        "options": {
            "script": outcome.options.script,
            "script_args": list(outcome.options.script_args),
            "after": outcome.options.after,
            "root": outcome.options.root,
            "steps": outcome.options.steps,
            "seed": outcome.options.seed,
            "device": outcome.options.device,
            "runs": outcome.options.runs,
            "tolerance": outcome.options.tolerance,
        },
        "migration": None,
        "runs": {
            "before": [_run_json(run) for run in outcome.before_runs],
            "fixed_before": [_run_json(run) for run in outcome.fixed_runs],
            "after": [_run_json(run) for run in outcome.after_runs],
        },
        "comparison": _comparison_json(outcome.comparison),
        "bug_fix": None,
        "workdir": outcome.workdir if outcome.kept else None,
    }
    if outcome.project is not None:
        data["migration"] = {
            "root": outcome.project.root,
            "changed_files": outcome.project.changed,
            "fixes": outcome.project.fixed,
            "remaining_findings": [f"{f.path}:{f.location.row}:{f.location.column}: {f.code}" for f in outcome.project.remaining],
            "errors": [str(e) for e in outcome.project.errors],
        }
    if outcome.bug_fix is not None:
        data["bug_fix"] = {
            "fixes": [fix.__dict__ for fix in outcome.bug_fix.fixes],
            "effect": _comparison_json(outcome.bug_fix_comparison),
            "summary": bug_fix_lines(outcome),
        }
    return data
