"""The README's promises: its test command is what CI runs, and its rule table is the catalogue."""

from __future__ import annotations

import runpy

from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = [line for line in ci.splitlines() if line.startswith("python3 -m venv")][0]
    assert command in README


def test_rule_table_matches_the_catalogue():
    table = runpy.run_path(str(ROOT / "scripts" / "rule_table.py"))["rule_table"]()
    assert table in README, "README rule table is stale: run `python scripts/rule_table.py`"
