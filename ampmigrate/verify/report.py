"""What `verify` shows: a table, a plot of the two curves, the verdict; and its JSON form."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ampmigrate.verify.runner import RunResult
from ampmigrate.verify.session import BASELINE_FP32, COULD_NOT_RUN, EQUIVALENT, Outcome
from ampmigrate.verify.termplot import line_chart

BEFORE_STYLE, AFTER_STYLE, NOISE_STYLE = "cyan", "magenta", "bright_black"


def baseline_name(outcome: Outcome) -> str:
    return "baseline (fp32)" if outcome.baseline_kind == BASELINE_FP32 else "before"


def render(outcome: Outcome, console: Console) -> None:
    if outcome.exit_code == COULD_NOT_RUN:
        _render_failure(outcome, console)
        return
    console.print(_title(outcome))
    console.print(_table(outcome))
    comparison = outcome.comparison
    series = [(f"{baseline_name(outcome)} seed {outcome.options.seed + i + 1}", curve, NOISE_STYLE) for i, curve in enumerate(comparison.noise)]
    series += [(baseline_name(outcome), comparison.baseline, BEFORE_STYLE), ("after", comparison.after, AFTER_STYLE)]
    width = max(30, min(72, console.width - 14))
    console.print(line_chart(series, width=width, height=12))
    console.print()
    for note in outcome.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if outcome.exit_code == EQUIVALENT:
        console.print(Text("EQUIVALENT", style="bold green"), Text(f"— {_criterion(outcome)}"))
    else:
        console.print(Text("NOT EQUIVALENT", style="bold red"))
        for reason in comparison.reasons:
            console.print(f"  - {reason}")
    if outcome.kept:
        console.print(Text(f"logs and the migrated copy: {outcome.workdir}", style="dim"))


def _title(outcome: Outcome) -> Text:
    options = outcome.options
    after = options.after or "the migrated copy"
    run = outcome.after
    device = run.device if run else options.device
    mapped = " (CUDA mapped to CPU)" if run and run.data.get("cuda_mapped") else ""
    title = Text.assemble(("ampmigrate verify ", "bold"), f"{options.script} vs. {after}\n")
    details = f"device {device}{mapped}, {options.steps} steps, seed {options.seed}"
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


def _table(outcome: Outcome) -> Table:
    baseline, after, comparison = outcome.baseline, outcome.after, outcome.comparison
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column(baseline_name(outcome), style=BEFORE_STYLE, justify="right", no_wrap=True)
    table.add_column("after", style=AFTER_STYLE, justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_row("precision", baseline.precision_label(), after.precision_label(), "")
    skipped = [len(run.data.get("skipped_steps", [])) for run in (baseline, after)]
    table.add_row(
        "steps run",
        f"{baseline.steps}" + (f" (+{skipped[0]} skipped)" if skipped[0] else ""),
        f"{after.steps}" + (f" (+{skipped[1]} skipped)" if skipped[1] else ""),
        "",
    )
    table.add_row(
        "final loss (EMA)",
        f"{comparison.final_baseline:.4f}",
        f"{comparison.final_after:.4f}",
        f"{comparison.final_difference:+.2%} (tol. {comparison.tolerance:.0%})",
    )
    if math.isfinite(comparison.max_deviation):
        deviation = f"{comparison.max_deviation:.3g} @ {comparison.max_deviation_step}"
        ratio = f"{comparison.ratio:.2f}x floor (max {comparison.multiple:g}x)"
    else:
        deviation, ratio = f"not finite @ {comparison.max_deviation_step}", ""
    table.add_row("max deviation (EMA)", "", deviation, ratio)
    floor_note = " (min.)" if comparison.floor_raised else ""
    table.add_row("noise floor", f"{comparison.noise_floor:.3g}{floor_note}", "", f"{len(comparison.noise) + 1} seeds")
    before_time, after_time = baseline.median_step_time, after.median_step_time
    speedup = f"{before_time / after_time:.2f}x speedup" if before_time and after_time else ""
    table.add_row("median step time", _seconds(before_time), _seconds(after_time), speedup)
    memory_label = "peak GPU memory" if after.memory_kind == "cuda" else "peak memory (RSS)"
    before_memory, after_memory = baseline.peak_memory, after.peak_memory
    saving = ""
    if before_memory and after_memory:
        saving = f"{(after_memory - before_memory) / before_memory:+.1%}"
    table.add_row(memory_label, _bytes(before_memory), _bytes(after_memory), saving)
    verdict = Text("equivalent", style="bold green") if outcome.exit_code == EQUIVALENT else Text("NOT equivalent", style="bold red")
    table.add_row("verdict", "", verdict, "")
    return table


def _criterion(outcome: Outcome) -> str:
    comparison = outcome.comparison
    return (
        f"the smoothed loss stays within {comparison.multiple:g}x the seed-to-seed noise floor of the "
        f"{baseline_name(outcome)} run and the final losses agree within {comparison.tolerance:.0%}"
    )


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
        "losses": [_finite_or_none(v) for v in run.losses],
        "median_step_time_s": run.median_step_time,
        "peak_memory_bytes": run.peak_memory,
        "memory_kind": run.memory_kind,
        "written_files": run.data.get("written_files", []),
        "error": run.data.get("error"),
        "log": run.log,
        "torch": run.data.get("torch"),
    }


def to_json(outcome: Outcome) -> Dict[str, Any]:
    comparison = outcome.comparison
    data: Dict[str, Any] = {
        "verdict": outcome.verdict,
        "exit_code": outcome.exit_code,
        "problem": outcome.problem,
        "baseline": "fp32 after" if outcome.baseline_kind == BASELINE_FP32 else "before",
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
            "before": _run_json(outcome.before_result),
            "baseline": _run_json(outcome.baseline),
            "after": _run_json(outcome.after),
            "noise": [_run_json(run) for run in outcome.noise],
        },
        "comparison": None,
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
    if comparison is not None:
        data["comparison"] = {
            "steps": comparison.steps,
            "ema_span": comparison.span,
            "final_loss_baseline": comparison.final_baseline,
            "final_loss_after": _finite_or_none(comparison.final_after),
            "final_relative_difference": _finite_or_none(comparison.final_difference),
            "max_smoothed_deviation": _finite_or_none(comparison.max_deviation),
            "max_deviation_step": comparison.max_deviation_step,
            "noise_floor": comparison.noise_floor,
            "noise_floor_is_minimum": comparison.floor_raised,
            "deviation_to_floor": _finite_or_none(comparison.ratio),
            "floor_multiple_limit": comparison.multiple,
            "tolerance": comparison.tolerance,
            "reasons": comparison.reasons,
            "smoothed": {
                "baseline": comparison.baseline,
                "after": [_finite_or_none(v) for v in comparison.after],
                "noise": comparison.noise,
            },
        }
    return data
