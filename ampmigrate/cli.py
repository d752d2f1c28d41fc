"""The `ampmigrate` command line: check, fix, rule (and verify, loaded only when asked for).

Exit status, like ruff: 0 clean, 1 findings (or, for `fix --diff`, changes to make), 2 usage
errors, bad configuration, files that could not be checked, or internal errors.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, List, Optional, Sequence

import click

from ampmigrate import __version__
from ampmigrate.config import ConfigError, Settings, resolve_settings
from ampmigrate.diagnostics import FileError
from ampmigrate.discovery import discover
from ampmigrate.engine.project import ProjectImports
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.cache import Cache, default_directory
from ampmigrate.engine.runner import READ_LIMIT_FACTOR, Job, RunResult, run_files, write_changes
from ampmigrate.engine.noqa_writer import add_noqa_comments
from ampmigrate.output import FORMATS, Report, renderer
from ampmigrate.output.diff import unified_diff
from ampmigrate.output.statistics import show_fixes, statistics
from ampmigrate.watch import watch

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _Group(click.Group):
    """Lists `verify` without importing it (it needs torch); loads it only when it runs.

    An unexpected exception anywhere is an internal error: one line on stderr, exit status 2
    (set AMPMIGRATE_DEBUG=1 for the traceback). A closed pipe on stdout is no error: status 1,
    nothing printed.
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # The reader went away (`ampmigrate check . | head`): stop quietly, as command-line
            # tools do, with the status Python's documentation suggests; nothing more can be
            # written to it (stdout now goes nowhere, so the exit's flush raises nothing).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_FINDINGS)
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            if os.environ.get("AMPMIGRATE_DEBUG"):
                raise
            click.echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
            sys.exit(EXIT_ERROR)

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), "verify", "server"])

    def get_command(self, ctx, name):
        if name == "server":
            return _server_command()
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


def run() -> None:
    """The program's entry (`ampmigrate ...`, `python -m ampmigrate ...`): `main()`, then the
    process ends as soon as the command is done and its output flushed, without the
    interpreter's finalization (tearing down LibCST's and the rules' modules and objects took
    about 30 ms after every run). Everything the commands write is written and closed by then,
    and their child processes are gone (or die with this one). `main()` called from Python
    raises SystemExit as click's commands do."""
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as the interpreter does with `sys.exit("message")`
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ampmigrate")
def main() -> None:
    """Find and fix legacy PyTorch mixed-precision code (apex.amp, torch.cuda.amp, GradScaler misuse, fp16)."""


def _server_command() -> click.Command:
    @click.command("server")
    def server() -> None:
        """Run the language server over stdio (for editors; needs `pip install 'ampmigrate[server]'`)."""
        try:
            from ampmigrate.server import serve
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            raise click.ClickException(f"`server` needs pygls ({missing} is missing): pip install 'ampmigrate[server]'")
        serve()

    return server


# ---------------------------------------------------------------------------------- shared options
def _selection_options(func: Callable) -> Callable:
    options = [
        click.option("--select", multiple=True, help="Rule codes or prefixes to enable (AMP, AMP2, AMP201); comma-separated or repeated. Replaces the configured list."),
        click.option("--extend-select", multiple=True, help="Codes or prefixes to enable in addition."),
        click.option("--ignore", multiple=True, help="Codes or prefixes to disable."),
        click.option("--target-dtype", help="bfloat16 (Ampere and newer; the default) or float16 (V100/T4 fleets)."),
        click.option("--min-torch", help="Oldest torch the code must keep running on (default 2.4); fixes never emit newer API."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Configuration file: pyproject.toml ([tool.ampmigrate]), ampmigrate.toml or .ampmigrate.toml (default: the nearest one)."),
        click.option("--force-exclude", is_flag=True, help="Apply the excludes to paths named on the command line too."),
        click.option("--stdin-filename", help="With `-` as PATHS: the file name standard input stands for (settings, notebooks, messages)."),
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


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_ERROR)


class _Progress:
    """A progress bar on stderr, shown only on a terminal and only once a run takes over a second.

    It advances by bytes, not files: the few large files that need LibCST are done last and take
    most of the time, so a count of files would sit at 100% while they are still being parsed."""

    def __init__(self, files: Sequence[str]) -> None:
        self.enabled = sys.stderr.isatty() and len(files) > 1
        # The sizes only for a bar that may be shown: a stat() per file otherwise for nothing.
        self.sizes = {path: _size(path) for path in files} if self.enabled else {}
        self.total = sum(self.sizes.values()) or 1
        self.remaining = len(files)
        self.done = 0
        self.start = time.monotonic()
        self.bar = None
        self.task = None

    def __call__(self, result) -> None:
        self.done += self.sizes.get(result.path, 0)
        self.remaining -= 1
        if not self.enabled:
            return
        if self.bar is None and time.monotonic() - self.start > 1.0:
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("checking", total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.completed)

    @property
    def completed(self) -> int:
        """Bytes done, kept below 99.5% (shown as 100%) while any file is left."""
        return self.done if self.remaining <= 0 else min(self.done, int(self.total * 0.99))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _size(path: str) -> int:
    try:
        return max(1, os.path.getsize(path))
    except OSError:
        return 1


def _cache(settings: Settings, no_cache: bool, cache_dir: Optional[str]) -> Optional[Cache]:
    if no_cache:
        return None
    return Cache.open(cache_dir or default_directory(settings), settings)


def _run(
    paths: Sequence[str], settings: Settings, job: Job, jobs: Optional[int], cache: Optional[Cache], force_exclude: bool = False
) -> RunResult:
    found = discover(list(paths) or ["."], settings, force_exclude=force_exclude)
    if not found.files and not found.errors:
        click.echo("warning: No Python files found under the given path(s)", err=True)
    project = None
    root = _project_root(settings, paths)
    if job.mode == "fix":
        # Fixes must not break other modules that import a rewritten name (see engine/project.py).
        scope = [root] if root else list(paths) or ["."]
        project_files = discover(scope, settings).files
        project = ProjectImports.scan(root or settings.root, [*project_files, *found.files], settings.max_file_size * READ_LIMIT_FACTOR)
    # What each file of the run does for training, for rules that look across files.
    index_root = _naming_root(settings, paths, root)
    index_cache = cache.index_path if cache is not None else None
    if index_cache is None or not os.path.exists(index_cache):
        # A cold run: the engine will be needed; a child builds the index while this process
        # imports the engine and the workers screen the files (engine/index_builder.py).
        from ampmigrate.engine.index_builder import IndexBeside

        index = IndexBeside.start(index_root, found.files, index_cache, settings.max_file_size)
    else:
        index = ProjectIndex.build(index_root, found.files, cache_path=index_cache, max_size=settings.max_file_size)
    progress = _Progress(found.files)
    try:
        result = run_files(
            found.files, settings, job, jobs=jobs, on_result=progress, cache=cache, project=project, index=index
        )
    finally:
        progress.close()
        if not isinstance(index, ProjectIndex):
            index.close()  # run_files has waited for it (or failed)
    if cache is not None:
        cache.prune()  # other run keys' entries unused for a month (an upgrade, an old config)
    result.errors.extend(found.errors)
    return result


def _project_root(settings: Settings, paths: Sequence[str] = ()) -> Optional[str]:
    """The project of the run, whose files `fix` must not break: the configuration's directory,
    else the git repository enclosing the working directory, else None. A run from elsewhere
    (`ampmigrate fix ~/src/project` in another repository or none) takes the git repository
    enclosing its paths instead, else None."""
    root = settings.root if settings.config_path else _git_root(os.getcwd())
    outside = _outside(paths, root or settings.root)
    if not outside:
        return root
    return _git_root(os.path.commonpath(outside))


def _naming_root(settings: Settings, paths: Sequence[str], project: Optional[str]) -> str:
    """The folder the run's dotted module names start from (the project index): the project,
    else the folder the paths share when they lie outside the working directory, else it.
    Outside this root a file has no dotted name but its own, so `from pkg.utils import setup`
    would name no file of the run."""
    if project is not None:
        return project
    outside = _outside(paths, settings.root)
    return os.path.commonpath(outside) if outside else settings.root


def _outside(paths: Sequence[str], folder: str) -> List[str]:
    """The folders of the `paths` (a file's own folder) that are not in `folder`; devices, pipes
    and missing paths aside."""
    folder = os.path.abspath(folder)
    found = []
    for path in map(os.path.abspath, paths):
        if os.path.isfile(path):
            path = os.path.dirname(path)
        elif not os.path.isdir(path):
            continue
        if path != folder and not path.startswith(folder.rstrip(os.sep) + os.sep):
            found.append(path)
    return found


def _git_root(start: str) -> Optional[str]:
    """The nearest folder at or above `start` holding `.git`, else None."""
    current = os.path.abspath(start)
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
def _settings_of(options: dict) -> Settings:
    return resolve_settings(
        options["select"], options["extend_select"], options["ignore"], options["target_dtype"],
        options["min_torch"], options["config_path"], options.get("unsafe_fixes"),
    )


def _resolve(options: dict) -> Settings:
    try:
        return _settings_of(options)
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _collect(options: dict, settings: Settings, job: Job) -> RunResult:
    """Run `job` over the PATHS, or over standard input when PATHS is `-`."""
    paths = options["paths"]
    if _reads_stdin(options):
        if len(paths) > 1:
            _fail("`-` (standard input) cannot be combined with other paths")
        from ampmigrate.stdin import run_stdin  # the engine, imported only when it runs

        return run_stdin(settings, job, options.get("stdin_filename"))
    cache = _cache(settings, options["no_cache"], options["cache_dir"])
    return _run(paths, settings, job, options["jobs"], cache, options["force_exclude"])


def _reads_stdin(options: dict) -> bool:
    """PATHS is `-`, or empty with --stdin-filename given (like ruff)."""
    return "-" in options["paths"] or (bool(options.get("stdin_filename")) and not options["paths"])


@main.command()
@_selection_options
@click.option("--output-format", type=click.Choice(FORMATS), default=None, help="full (default), concise, json, github or sarif.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--unsafe-fixes", is_flag=True, help="Apply safe and unsafe fixes: the same as `ampmigrate fix --unsafe-fixes`.")
@click.option("--fix", "apply_fixes", is_flag=True, help="Apply the fixes: the same as `ampmigrate fix`.")
@click.option("--show-fixes", is_flag=True, help="With --fix: list the fixes applied, per file and rule.")
@click.option("--statistics", is_flag=True, help="Show the number of findings per rule instead of the findings.")
@click.option("--add-noqa", is_flag=True, help="Add `# noqa: CODE` to every line with a finding (writes files).")
@click.option("--watch", is_flag=True, help="Check again whenever a file changes (needs `pip install 'ampmigrate[watch]'`).")
@click.pass_context
def check(ctx, **options):
    """Report legacy mixed-precision code in PATHS (default: the current directory; `-`: standard input)."""
    # `check --fix` and `check --unsafe-fixes` are typed from ruff habit: both mean `fix`.
    if options.pop("apply_fixes") or options["unsafe_fixes"]:
        for unused in ("output_format", "statistics", "add_noqa", "watch"):
            options.pop(unused)
        ctx.invoke(fix, **options, diff=False, exit_non_zero_on_fix=False)
        return
    settings = _resolve(options)
    output_format = options["output_format"] or os.environ.get("AMPMIGRATE_OUTPUT_FORMAT") or "full"
    if output_format not in FORMATS:
        _fail(f"unknown output format {output_format!r}")
    if options["watch"]:
        watch(options["paths"], lambda: _check_again(options, output_format))
        return
    if options["add_noqa"]:
        sys.exit(_add_noqa(options, settings))
    sys.exit(_check_once(options, settings, output_format))


def _check_once(options: dict, settings: Settings, output_format: str) -> int:
    """One check run, printed; returns the exit status."""
    want_edits = output_format in ("json", "sarif")
    result = _collect(options, settings, Job("check", want_edits=want_edits))
    errors = result.all_errors
    report = Report(result.findings, errors, result.files, settings.unsafe_fixes)
    if options["statistics"]:
        text = statistics(report)
    elif output_format == "full":
        text = renderer("full")(report, color=sys.stdout.isatty())
    else:
        text = renderer(output_format)(report)
    click.echo(text, nl=False)
    _print_errors(errors)
    if errors:
        return EXIT_ERROR
    if any(f.fails_run for f in report.findings) and not options["exit_zero"]:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _check_again(options: dict, output_format: str) -> int:
    """One run of `--watch`: the configuration is read again (it may have changed), and a bad
    one is reported without ending the watch."""
    try:
        settings = _settings_of(options)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_ERROR
    return _check_once(options, settings, output_format)


def _add_noqa(options: dict, settings: Settings) -> int:
    if _reads_stdin(options):
        _fail("--add-noqa writes files; it cannot read standard input")
    result = _collect(options, settings, Job("check"))
    added, problems = add_noqa_comments(result.findings)
    errors = result.all_errors + problems
    click.echo(f"Added {added} noqa directive{'s' if added != 1 else ''}.")
    _print_errors(errors)
    return EXIT_ERROR if errors else EXIT_CLEAN


# ---------------------------------------------------------------------------------- fix
@main.command()
@_selection_options
@click.option("--unsafe-fixes", is_flag=True, help="Also apply unsafe fixes (those that change numerics, e.g. fp16 -> bf16).")
@click.option("--diff", is_flag=True, help="Print a unified diff of the changes and write nothing; exit 1 if there are changes.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings remain.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when any file was changed.")
@click.option("--show-fixes", is_flag=True, help="List the fixes applied, per file and rule.")
def fix(**options):
    """Rewrite legacy mixed-precision code in PATHS to the torch.amp recipe (safe fixes by default).

    With `-` as PATHS, reads standard input and writes the fixed code to standard output."""
    settings = _resolve(options)
    result = _collect(options, settings, Job("fix", unsafe=settings.unsafe_fixes))
    if _reads_stdin(options):
        sys.exit(_fix_stdin(result, options))
    changed = result.changed
    if options["diff"]:
        for outcome in changed:
            click.echo(unified_diff(outcome.path, outcome.old_text, outcome.new_text), nl=False)
        errors = result.all_errors
        _print_errors(errors)
        noun = "finding" if result.fixed == 1 else "findings"
        click.echo(f"Would fix {result.fixed} {noun} in {len(changed)} file{'s' if len(changed) != 1 else ''}.", err=True)
        sys.exit(EXIT_ERROR if errors else EXIT_FINDINGS if changed else EXIT_CLEAN)
    write_errors = write_changes(result)
    fixed = result.fixed
    written_paths = {o.path for o in changed} - {e.path for e in write_errors}
    if settings.unsafe_fixes and written_paths:
        # An unsafe fix may depend on what another file's fix just did (AMP401's bfloat16 fix on a
        # scaler that an apex migration now hands to a helper of another file), and the run's
        # project index was built from the files as they were: run again over the written files,
        # so that a second `fix` changes nothing. Bounded; safe fixes decide across files alike.
        for _ in range(_UNSAFE_PASSES):
            again = _collect(options, settings, Job("fix", unsafe=True))
            if not again.changed:
                result = again
                break
            more_errors = write_changes(again)
            write_errors += more_errors
            fixed += again.fixed
            written_paths |= {o.path for o in again.changed} - {e.path for e in more_errors}
            result = again
    errors = result.all_errors + write_errors
    remaining = result.findings
    report = Report(remaining, errors, result.files, settings.unsafe_fixes)
    if remaining:
        click.echo(renderer("concise")(report), nl=False)
    written = len(written_paths)
    click.echo(_fix_summary(fixed, written, remaining))
    if options["show_fixes"]:
        click.echo(show_fixes(result), nl=False)
    _print_errors(errors)
    if errors:
        sys.exit(EXIT_ERROR)
    if options["exit_non_zero_on_fix"] and written:
        sys.exit(EXIT_FINDINGS)
    if any(f.fails_run for f in remaining) and not options["exit_zero"]:
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)


_UNSAFE_PASSES = 2  # further passes of `fix --unsafe-fixes` over a run whose first pass wrote files


def _fix_summary(fixed: int, written: int, remaining) -> str:
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
    return line + "."


def _fix_stdin(result: RunResult, options: dict) -> int:
    """`fix -`: the fixed code (or the input unchanged) on stdout; everything else on stderr."""
    (outcome,) = result.results or [None]
    errors = result.all_errors
    if outcome is not None:
        from ampmigrate.stdin import stdin_output

        sys.stdout.buffer.write(stdin_output(outcome))
        sys.stdout.flush()
    remaining = result.findings
    if remaining:
        click.echo(renderer("concise")(Report(remaining)), nl=False, err=True)
    click.echo(_fix_summary(result.fixed, len(result.changed), remaining), err=True)
    _print_errors(errors)
    if errors:
        return EXIT_ERROR
    if options["exit_non_zero_on_fix"] and result.changed:
        return EXIT_FINDINGS
    if any(f.fails_run for f in remaining) and not options["exit_zero"]:
        return EXIT_FINDINGS
    return EXIT_CLEAN


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
