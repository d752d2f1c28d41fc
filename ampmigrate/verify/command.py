"""`ampmigrate verify SCRIPT [-- SCRIPT_ARGS...]` (the click command; imports no torch)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

import click

from ampmigrate.config import ConfigError, resolve_settings
from ampmigrate.verify.session import COULD_NOT_RUN, Options, run_verification
from ampmigrate.verify.stats import DEFAULT, MIN_STEPS

_EPILOG = f"""\b
Exit status: 0 equivalent, 1 not equivalent, 2 could not run.
Equivalent: over K runs per side paired by seed, the after's mean loss
stays within the before runs' seed-to-seed spread along the run, and the
final losses are equivalent (two one-sided tests) within the larger of
--tolerance and {DEFAULT.spread_margin:g} seed-to-seed spreads.
"""


class LiveLine:
    """Progress on stderr: stage lines, and on a terminal one line of step counts rewritten in place."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.shown = 0

    def line(self, message: str) -> None:
        self.clear()
        click.echo(message, err=True)

    def update(self, status: str) -> None:
        if not self.live:
            return
        text = status[: max(20, _width() - 1)]
        self.stream.write("\r" + text.ljust(self.shown))
        self.stream.flush()
        self.shown = len(text)

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0


def _width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 20)).columns


@click.command(
    "verify",
    epilog=_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("script", required=False, type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--after", "after", type=click.Path(exists=True, dir_okay=False), help="Compare SCRIPT with this file instead of with SCRIPT migrated.")
@click.option("--root", type=click.Path(exists=True, file_okay=False), help="The project to migrate, in a temporary copy (default: the script's folder).")
@click.option("--steps", type=click.IntRange(min=MIN_STEPS), default=200, show_default=True, help="Optimizer steps per run.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first run of each side; run k uses seed+k.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True, help="cpu runs CUDA code on the CPU (CPU autocast, CPU GradScaler).")
@click.option("--runs", type=click.IntRange(min=2), default=DEFAULT.runs, show_default=True, help="Runs per side, paired by seed (the error rates in README hold for the default).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=DEFAULT.margin, show_default=True, help="Equivalence margin of the final loss, relative (at least the seed-to-seed spread's).")
@click.option("--jobs", type=click.IntRange(min=1), help="Runs at a time (default: one per CPU core; one on a GPU).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the full result (curves, timings, verdict) as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write the loss curves as a PNG (needs matplotlib).")
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds each run may take.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder (migrated copy, logs) also when equivalent.")
@click.option("--clean", is_flag=True, help="Remove the temporary folders earlier verifications kept, and exit.")
@click.option("--isolation", type=click.Choice(["auto", "namespace", "redirect"]), default="auto", show_default=True,
              help="namespace: each run in its own user and mount namespaces (Linux), writes land in overlays; redirect: writes redirected inside Python (catches less).")
@click.option("--unsafe-fixes/--no-unsafe-fixes", default=True, show_default=True, help="Migrate with the unsafe fixes too (verifying them is the point).")
@click.option("--select", multiple=True, help="Rule codes or prefixes the migration applies.")
@click.option("--extend-select", multiple=True, help="Codes or prefixes to enable in addition.")
@click.option("--ignore", multiple=True, help="Codes or prefixes to leave out of the migration.")
@click.option("--target-dtype", help="bfloat16 (default) or float16.")
@click.option("--min-torch", help="Oldest torch the migrated code must run on (default 2.4).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="pyproject.toml to read [tool.ampmigrate] from (default: the nearest to the project root).")
def verify(script, script_args, after, root, steps, seed, device, runs, tolerance, jobs, json_path, plot_path, timeout, keep,
           clean, isolation, unsafe_fixes, select, extend_select, ignore, target_dtype, min_torch, config_path):
    """Run SCRIPT's training loop before and after the migration and compare the loss curves.

    The after run is SCRIPT's project (--root) migrated in a temporary copy with the fixes `fix`
    would apply; it runs with the same working directory, arguments and seed as the before run.
    Arguments after `--` go to the script. The user's files are never modified.
    """
    if clean:
        _clean()
        return
    if script is None:
        raise click.UsageError("Missing argument 'SCRIPT'.")
    if importlib.util.find_spec("torch") is None:  # the runs use this interpreter
        click.echo("error: `verify` runs your training script, so it needs PyTorch: pip install 'ampmigrate[verify]'", err=True)
        sys.exit(COULD_NOT_RUN)
    try:
        settings = resolve_settings(select, extend_select, ignore, target_dtype, min_torch, config_path,
                                    start=root or os.path.dirname(os.path.abspath(script)))
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(COULD_NOT_RUN)
    settings = dataclasses.replace(settings, unsafe_fixes=unsafe_fixes)
    if plot_path and importlib.util.find_spec("matplotlib") is None:
        click.echo("error: --plot needs matplotlib: pip install 'ampmigrate[plot]'", err=True)
        sys.exit(COULD_NOT_RUN)
    options = Options(
        script=script,
        script_args=list(script_args),
        after=after,
        root=root,
        steps=steps,
        seed=seed,
        device=device,
        runs=runs,
        tolerance=tolerance,
        timeout=timeout,
        keep=keep,
        isolation=isolation,
        jobs=jobs,
    )
    counter = LiveLine(sys.stderr)

    try:
        outcome = run_verification(options, settings, counter.line, counter.update)
    except KeyboardInterrupt:
        counter.clear()
        click.echo("interrupted", err=True)
        sys.exit(COULD_NOT_RUN)
    counter.clear()

    from rich.console import Console

    from ampmigrate.verify.report import render, to_json

    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=False, width=100)  # logs and pipes: room for the table
    render(outcome, console)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(to_json(outcome), handle, indent=1)
    if plot_path and outcome.comparison is not None:
        from ampmigrate.verify.plot import write_png

        write_png(outcome, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    sys.exit(outcome.exit_code)


def _clean() -> None:
    """`verify --clean`: remove the verify folders no running verify owns."""
    from ampmigrate.verify.runner import remove_workdir, stale_workdirs

    stale, in_use = stale_workdirs()
    for path in stale:
        remove_workdir(path)
        click.echo(f"removed {path}")
    summary = f"removed {len(stale)} verify folder(s)"
    if in_use:
        summary += f"; {len(in_use)} in use by a running verify left alone"
    click.echo(summary)
