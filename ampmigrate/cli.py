"""The `ampmigrate` command line: check, fix, rule (and verify, loaded only when asked for).

Exit status, like ruff: 0 clean, 1 findings (or, for `fix --diff`, changes to make), 2 usage
errors, bad configuration, files that could not be checked, or internal errors.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import time
from typing import Callable, List, Optional, Sequence

import click

from ampmigrate import __version__
from ampmigrate.api import parse_version
from ampmigrate.config import ConfigError, Settings, check_target_dtype, load_settings, split_codes, validate_codes
from ampmigrate.diagnostics import FileError
from ampmigrate.discovery import discover
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.cache import Cache, default_directory
from ampmigrate.engine.runner import Job, RunResult, run_files, write_changes
from ampmigrate.output import FORMATS, Report, renderer, summary
from ampmigrate.source import split_lines

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _Group(click.Group):
    """Lists `verify` without importing it (it needs torch); loads it only when it runs.

    An unexpected exception anywhere is an internal error: one line on stderr, exit status 2
    (set AMPMIGRATE_DEBUG=1 for the traceback).
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            if os.environ.get("AMPMIGRATE_DEBUG"):
                raise
            click.echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
            sys.exit(EXIT_ERROR)

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), "verify"])

    def get_command(self, ctx, name):
        if name == "verify":
            try:
                from ampmigrate.verify.command import verify
            except ImportError as exc:
                missing = getattr(exc, "name", None) or str(exc)

                @click.command(
                    "verify",
                    help="Run a training script before and after migration (needs torch).",
                    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                )
                @click.argument("args", nargs=-1, type=click.UNPROCESSED)
                def verify(args) -> None:
                    raise click.ClickException(
                        f"`verify` needs PyTorch ({missing} is missing): pip install 'ampmigrate[verify]'"
                    )

            return verify
        return super().get_command(ctx, name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ampmigrate")
def main() -> None:
    """Find and fix legacy PyTorch mixed-precision code (apex.amp, torch.cuda.amp, GradScaler misuse, fp16)."""


# ---------------------------------------------------------------------------------- shared options
def _selection_options(func: Callable) -> Callable:
    options = [
        click.option("--select", multiple=True, help="Rule codes or prefixes to enable (AMP, AMP2, AMP201); comma-separated or repeated. Replaces the configured list."),
        click.option("--extend-select", multiple=True, help="Codes or prefixes to enable in addition."),
        click.option("--ignore", multiple=True, help="Codes or prefixes to disable."),
        click.option("--target-dtype", help="bfloat16 (Ampere and newer; the default) or float16 (V100/T4 fleets)."),
        click.option("--min-torch", help="Oldest torch the code must keep running on (default 2.4); fixes never emit newer API."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), help="pyproject.toml to read [tool.ampmigrate] from (default: the nearest one)."),
        click.option("-j", "--jobs", type=click.IntRange(min=1), help="Worker processes (default: all cores)."),
        click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache."),
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            envvar="AMPMIGRATE_CACHE_DIR",
            help="Result cache directory [env: AMPMIGRATE_CACHE_DIR] (default: .ampmigrate_cache beside the configuration).",
        ),
        click.argument("paths", nargs=-1, type=click.Path()),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _settings(select, extend_select, ignore, target_dtype, min_torch, config_path, unsafe_fixes=None, start=None) -> Settings:
    """Settings from the configuration (the nearest to `start`, default the working directory) and the options."""
    from ampmigrate.rules import rule_classes

    settings = load_settings(config_path, start=start)
    known = [cls.code for cls in rule_classes()]
    origin = settings.config_path or "configuration"
    validate_codes(settings.select + settings.extend_select + settings.ignore, known, origin)
    changes = {}
    if select:
        changes["select"] = split_codes(select)
    if extend_select:
        changes["extend_select"] = settings.extend_select + split_codes(extend_select)
    if ignore:
        changes["ignore"] = settings.ignore + split_codes(ignore)
    for key in ("select", "extend_select", "ignore"):
        if key in changes:
            validate_codes(changes[key], known, f"--{key.replace('_', '-')}")
    if target_dtype:
        changes["target_dtype"] = check_target_dtype(target_dtype, "--target-dtype")
    if min_torch:
        try:
            changes["min_torch"] = parse_version(min_torch)
        except ValueError as exc:
            raise ConfigError(f"--min-torch: {exc}") from None
    if unsafe_fixes:
        changes["unsafe_fixes"] = True
    return dataclasses.replace(settings, **changes)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_ERROR)


class _Progress:
    """A progress bar on stderr, shown only on a terminal and only once a run takes over a second."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.bar = None
        self.task = None
        self.enabled = sys.stderr.isatty() and total > 1

    def __call__(self, _result) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is None and time.monotonic() - self.start > 1.0:
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("checking", total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _cache(settings: Settings, no_cache: bool, cache_dir: Optional[str]) -> Optional[Cache]:
    if no_cache:
        return None
    return Cache.open(cache_dir or default_directory(settings), settings)


def _run(paths: Sequence[str], settings: Settings, job: Job, jobs: Optional[int], cache: Optional[Cache]) -> RunResult:
    found = discover(list(paths) or ["."], settings)
    project = None
    root = None
    if job.mode == "fix":
        # Fixes must not break other modules that import a rewritten name (see engine/project.py).
        root = _project_root(settings)
        scope = [root] if root else list(paths) or ["."]
        project_files = discover(scope, settings).files
        project = ProjectImports.scan(root or settings.root, [*project_files, *found.files])
    # What each file of the run does for training, for rules that look across files.
    index = ProjectIndex.build(
        root or _project_root(settings) or settings.root,
        found.files,
        cache_path=cache.index_path if cache is not None else None,
        max_size=settings.max_file_size,
    )
    progress = _Progress(len(found.files))
    try:
        result = run_files(
            found.files, settings, job, jobs=jobs, on_result=progress, cache=cache, project=project, index=index
        )
    finally:
        progress.close()
    if cache is not None:
        cache.prune()  # other run keys' entries unused for a month (an upgrade, an old config)
    result.errors.extend(found.errors)
    return result


def _project_root(settings: Settings) -> Optional[str]:
    """The configuration's directory, else the enclosing git repository, else None."""
    if settings.config_path:
        return settings.root
    current = os.path.abspath(os.getcwd())
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _print_errors(errors: List[FileError]) -> None:
    for error in sorted(set(errors), key=lambda e: (e.path, e.message)):
        click.echo(f"error: {error}", err=True)


# ---------------------------------------------------------------------------------- check
@main.command()
@_selection_options
@click.option("--output-format", type=click.Choice(FORMATS), default=None, help="full (default), concise, json, github or sarif.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--unsafe-fixes", is_flag=True, help="Count unsafe fixes as available in the output.")
def check(paths, select, extend_select, ignore, target_dtype, min_torch, config_path, jobs, no_cache, cache_dir, output_format, exit_zero, unsafe_fixes):
    """Report legacy mixed-precision code in PATHS (default: the current directory)."""
    try:
        settings = _settings(select, extend_select, ignore, target_dtype, min_torch, config_path, unsafe_fixes)
    except ConfigError as exc:
        _fail(str(exc))
    output_format = output_format or os.environ.get("AMPMIGRATE_OUTPUT_FORMAT") or "full"
    if output_format not in FORMATS:
        _fail(f"unknown output format {output_format!r}")
    want_edits = output_format in ("json", "sarif")
    result = _run(paths, settings, Job("check", want_edits=want_edits), jobs, _cache(settings, no_cache, cache_dir))
    errors = result.all_errors
    report = Report(result.findings, errors, result.files, settings.unsafe_fixes)
    render = renderer(output_format)
    if output_format == "full":
        text = render(report, color=sys.stdout.isatty())
    else:
        text = render(report)
    click.echo(text, nl=False)
    _print_errors(errors)
    if errors:
        sys.exit(EXIT_ERROR)
    if any(f.fails_run for f in report.findings) and not exit_zero:
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)


# ---------------------------------------------------------------------------------- fix
@main.command()
@_selection_options
@click.option("--unsafe-fixes", is_flag=True, help="Also apply unsafe fixes (those that change numerics, e.g. fp16 -> bf16).")
@click.option("--diff", is_flag=True, help="Print a unified diff of the changes and write nothing; exit 1 if there are changes.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings remain.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when any file was changed.")
def fix(paths, select, extend_select, ignore, target_dtype, min_torch, config_path, jobs, no_cache, cache_dir, unsafe_fixes, diff, exit_zero, exit_non_zero_on_fix):
    """Rewrite legacy mixed-precision code in PATHS to the torch.amp recipe (safe fixes by default)."""
    try:
        settings = _settings(select, extend_select, ignore, target_dtype, min_torch, config_path, unsafe_fixes)
    except ConfigError as exc:
        _fail(str(exc))
    result = _run(paths, settings, Job("fix", unsafe=settings.unsafe_fixes), jobs, _cache(settings, no_cache, cache_dir))
    changed = result.changed
    if diff:
        for outcome in changed:
            click.echo(
                "".join(
                    difflib.unified_diff(
                        split_lines(outcome.old_text, keepends=True),
                        split_lines(outcome.new_text, keepends=True),
                        fromfile=outcome.path,
                        tofile=outcome.path,
                    )
                ),
                nl=False,
            )
        errors = result.all_errors
        _print_errors(errors)
        noun = "finding" if result.fixed == 1 else "findings"
        click.echo(f"Would fix {result.fixed} {noun} in {len(changed)} file{'s' if len(changed) != 1 else ''}.", err=True)
        sys.exit(EXIT_ERROR if errors else EXIT_FINDINGS if changed else EXIT_CLEAN)
    write_errors = write_changes(result)
    errors = result.all_errors + write_errors
    remaining = result.findings
    report = Report(remaining, errors, result.files, settings.unsafe_fixes)
    if remaining:
        click.echo(renderer("concise")(report), nl=False)
    fixed = result.fixed
    written = len(changed) - len(write_errors)
    line = f"Fixed {fixed} finding{'s' if fixed != 1 else ''} in {written} file{'s' if written != 1 else ''}"
    if remaining:
        unsafe = sum(1 for f in remaining if f.fix is not None and f.fix.applicability == "unsafe")
        manual = sum(1 for f in remaining if f.fix is None)
        details = []
        if unsafe:
            details.append(f"{unsafe} fixable with --unsafe-fixes")
        if manual:
            details.append(f"{manual} need a manual change")
        line += f"; {len(remaining)} remaining" + (f" ({', '.join(details)})" if details else "")
    click.echo(line + ".")
    _print_errors(errors)
    if errors:
        sys.exit(EXIT_ERROR)
    if exit_non_zero_on_fix and written:
        sys.exit(EXIT_FINDINGS)
    if any(f.fails_run for f in remaining) and not exit_zero:
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)


# ---------------------------------------------------------------------------------- rule
@main.command()
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="List every rule.")
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text")
def rule(code, show_all, output_format):
    """Explain a rule (what, why, example, fix safety), or list them all."""
    from ampmigrate.catalogue import load_catalogue
    from ampmigrate.rule_docs import render_rule, render_rule_list, rules_json

    docs = load_catalogue()
    if show_all or code is None:
        if output_format == "json":
            click.echo(rules_json(list(docs.values())))
        else:
            render_rule_list(list(docs.values()))
        return
    doc = docs.get(code.upper())
    if doc is None:
        _fail(f"unknown rule {code!r}; `ampmigrate rule --all` lists them")
    if output_format == "json":
        click.echo(rules_json([doc]))
    else:
        render_rule(doc)
