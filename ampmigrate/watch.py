"""`check --watch`: check once, then again whenever a Python file, notebook or configuration
under the paths changes (watchfiles; an optional dependency: `pip install 'ampmigrate[watch]'`)."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional, Sequence

import click

from ampmigrate.config import STANDALONE_CONFIGS
from ampmigrate.discovery import DISCOVERED_SUFFIXES

WATCHED_NAMES = (*STANDALONE_CONFIGS, "pyproject.toml", ".gitignore")


def watched(_change, path: str) -> bool:
    return path.endswith(DISCOVERED_SUFFIXES) or os.path.basename(path) in WATCHED_NAMES


def watch(paths: Sequence[str], check_once: Callable[[], int], stop_event: Optional[object] = None) -> None:
    try:
        import watchfiles
    except ImportError:
        raise click.ClickException("--watch needs watchfiles: pip install 'ampmigrate[watch]'") from None
    if "-" in paths:
        raise click.ClickException("--watch cannot read standard input")
    targets = list(paths) or ["."]
    click.echo("Watching for changes (Ctrl-C to stop).", err=True)
    check_once()
    try:
        for changes in watchfiles.watch(*targets, watch_filter=watched, stop_event=stop_event, raise_interrupt=False):
            click.echo(f"\n[{time.strftime('%H:%M:%S')}] {len(changes)} change{'s' if len(changes) != 1 else ''}; checking again.", err=True)
            check_once()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        pass
