"""Golden-file tests, one directory per rule: tests/fixtures/<CODE>/.

For each `<case>.py`:
- `<case>.findings` lists what `check` reports, one `row:col CODE` per line (required);
- `<case>.expected.py` is what `fix` turns it into (absent: `fix` must leave it byte-identical);
- `cases.toml` may give a case settings: `[case] select = [...]`, `unsafe-fixes = true`, ...
  By default a case selects its own family (AMP3 for tests/fixtures/AMP301/), so other families'
  findings don't churn its golden files; composition across families is tested where a case
  selects more (and in tests/test_spec.py).
Every fixed output must parse, be a fixed point (fixing it again changes nothing), and the
pre-filter must not drop any finding (checked by running the rules with the filter bypassed).

Set AMPMIGRATE_UPDATE_FIXTURES=1 to (re)write the golden files from current behaviour; review
every diff that produces before committing it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import libcst as cst
import pytest

from ampmigrate.engine.pipeline import Engine

from conftest import FIXTURES, make_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UPDATE = os.environ.get("AMPMIGRATE_UPDATE_FIXTURES") == "1"


def _cases():
    for directory in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name.startswith("AMP")):
        options = {}
        if (directory / "cases.toml").exists():
            options = tomllib.loads((directory / "cases.toml").read_text(encoding="utf-8"))
        for case in sorted(directory.glob("*.py")):
            if case.name.endswith(".expected.py"):
                continue
            case_options = {"select": [directory.name[:4]], **options.get(case.stem, {})}
            yield pytest.param(case, case_options, id=f"{directory.name}/{case.stem}")


CASES = list(_cases())


def _findings_text(findings) -> str:
    return "".join(f"{f.location.row}:{f.location.column} {f.code}\n" for f in findings)


@pytest.mark.parametrize("case,options", CASES)
def test_fixture(case: Path, options):
    text = case.read_bytes().decode("utf-8")
    settings = make_settings(options)
    engine = Engine(settings)

    findings = engine.check_text(text, str(case)).findings
    findings_file = case.with_suffix(".findings")
    if UPDATE:
        findings_file.write_text(_findings_text(findings), encoding="utf-8")
    assert _findings_text(findings) == findings_file.read_text(encoding="utf-8")

    result = engine.fix_text(text, str(case))
    assert not result.errors, result.errors
    fixed = result.new_text if result.new_text is not None else text
    expected_file = case.with_name(case.stem + ".expected.py")
    if UPDATE:
        if fixed != text:
            expected_file.write_bytes(fixed.encode("utf-8"))
        elif expected_file.exists():
            expected_file.unlink()
    if expected_file.exists():
        assert fixed == expected_file.read_bytes().decode("utf-8")
        assert fixed != text, "an .expected.py identical to its input: delete it instead"
    else:
        assert fixed == text, "fix changed a fixture that has no .expected.py"
    cst.parse_module(fixed)
    compile(fixed, str(case), "exec")
    again = engine.fix_text(fixed, str(case))
    assert again.new_text is None, "fixing the fixed output changed it again (not idempotent)"


@pytest.mark.parametrize("case,options", CASES)
def test_prefilter_drops_no_finding(case: Path, options):
    text = case.read_text(encoding="utf-8")
    engine = Engine(make_settings(options))
    with_filter = engine.check_text(text, str(case)).findings
    engine.prefilter.rules_for = lambda _text, **_options: list(engine.rules)  # bypass the filter
    engine._rules_for = lambda _text, *_path, **_options: list(engine.rules)
    without_filter = engine.check_text(text, str(case)).findings
    assert _findings_text(with_filter) == _findings_text(without_filter)
