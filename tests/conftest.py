"""Shared helpers for the test suite."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from click.testing import CliRunner

from ampmigrate.api import parse_version
from ampmigrate.cli import main
from ampmigrate.config import Settings
from ampmigrate.engine.pipeline import Engine

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_SPEC = ROOT.parent / "shared" / "spec"


def make_settings(options: Optional[Dict[str, object]] = None) -> Settings:
    """Settings from catalogue/fixture option names (`unsafe-fixes`, `select`, ...)."""
    options = dict(options or {})
    changes: Dict[str, object] = {}
    for key, value in options.items():
        field = key.replace("-", "_")
        if field in ("select", "ignore", "extend_select"):
            value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        elif field == "min_torch":
            value = parse_version(str(value))
        changes[field] = value
    return dataclasses.replace(Settings(), **changes)


def check(text: str, path: str = "example.py", **options) -> List:
    return Engine(make_settings(options)).check_text(text, path).findings


def fix(text: str, path: str = "example.py", **options) -> str:
    settings = make_settings(options)
    result = Engine(settings).fix_text(text, path)
    assert not result.errors, result.errors
    return result.new_text if result.new_text is not None else text


def codes(findings) -> List[str]:
    return [f.code for f in findings]


def project_findings(cli, project: Path, *extra: str, select: str = "AMP101", file: str = "train.py") -> List[dict]:
    """`check --output-format json` of a project folder, run from inside it: the findings in `file`."""
    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = cli("check", "--exit-zero", "--select", select, "--output-format", "json", *extra, ".")
    finally:
        os.chdir(cwd)
    return [f for f in json.loads(result.output) if f["filename"].endswith(file)]


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str, input: Optional[str] = None):
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return invoke


def pytest_collection_modifyitems(config, items):
    """Under `pytest -n` (pytest-xdist), the `slow` tests first: the long runs start at once and
    the short tests fill in behind them, instead of a few long ones ending the run alone."""
    if getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
