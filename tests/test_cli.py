"""The command line, end to end: exit codes, formats, selection, configuration, discovery."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

LEGACY = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n"
FIXED = 'import torch\n\nwith torch.amp.autocast("cuda"):\n    pass\n'
CLEAN = "import torch\n\nwith torch.amp.autocast('cuda'):\n    pass\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def test_exit_codes(cli, project):
    write(project / "clean.py", CLEAN)
    assert cli("check", "clean.py").exit_code == 0
    write(project / "legacy.py", LEGACY)
    result = cli("check", "legacy.py", "--output-format", "concise")
    assert result.exit_code == 1
    assert result.output.startswith("legacy.py:3:6: AMP201 [*] `torch.cuda.amp.autocast` is deprecated")
    assert cli("check", "legacy.py", "--exit-zero").exit_code == 0
    assert cli("check", "--select", "AMP9").exit_code == 2
    assert cli("check", "--min-torch", "two").exit_code == 2
    assert cli("check", "--target-dtype", "fp8").exit_code == 2


def test_default_path_is_the_current_directory_and_output_is_sorted(cli, project):
    write(project / "b.py", LEGACY)
    write(project / "a" / "z.py", LEGACY)
    result = cli("check", "--output-format", "concise")
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["a/z.py", "b.py"]


def test_select_ignore_and_families(cli, project):
    write(project / "x.py", "import torch\ns = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n")

    def found(*args):
        out = cli("check", "x.py", "--output-format", "concise", *args).output
        return sorted(line.split()[1] for line in out.splitlines())

    assert found() == ["AMP201", "AMP202"]
    assert found("--select", "AMP202") == ["AMP202"]
    assert found("--select", "AMP2", "--ignore", "AMP201") == ["AMP202"]
    assert found("--select", "AMP201,AMP202") == ["AMP201", "AMP202"]
    assert found("--ignore", "AMP2", "--extend-select", "AMP201") == ["AMP201"]  # more specific wins


def test_pyproject_configuration_and_cli_precedence(cli, project):
    write(project / "x.py", "import torch\ns = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n")
    write(project / "pyproject.toml", '[tool.ampmigrate]\nignore = ["AMP201"]\nmin-torch = "2.4"\n')
    out = cli("check", "x.py", "--output-format", "concise").output
    assert "AMP202" in out and "AMP201" not in out
    out = cli("check", "x.py", "--output-format", "concise", "--min-torch", "2.2").output
    assert out == ""  # CLI wins: GradScaler is not deprecated for torch 2.2 users
    write(project / "pyproject.toml", '[tool.ampmigrate]\nselcet = ["AMP2"]\n')
    result = cli("check", "x.py")
    assert result.exit_code == 2 and "unknown key 'selcet'" in result.output
    write(project / "pyproject.toml", '[tool.ampmigrate]\nselect = ["AMP9"]\n')
    assert cli("check", "x.py").exit_code == 2
    write(project / "pyproject.toml", '[tool.ampmigrate]\ntarget-dtype = "int8"\n')
    assert cli("check", "x.py").exit_code == 2


def test_nearest_pyproject_above_the_working_directory(cli, project, monkeypatch):
    write(project / "pyproject.toml", '[tool.ampmigrate]\nselect = ["AMP202"]\n')
    write(project / "pkg" / "x.py", "import torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    monkeypatch.chdir(project / "pkg")
    assert cli("check", "x.py").exit_code == 0


def test_json_output_has_ruffs_shape(cli, project):
    write(project / "legacy.py", LEGACY)
    data = json.loads(cli("check", "legacy.py", "--output-format", "json").output)
    (item,) = data
    assert set(item) >= {"code", "message", "filename", "location", "end_location", "fix", "url", "noqa_row"}
    assert item["location"] == {"row": 3, "column": 6}
    assert item["fix"]["applicability"] == "safe"
    edit = item["fix"]["edits"][0]
    assert set(edit) == {"content", "location", "end_location"}
    assert os.path.isabs(item["filename"])


def test_github_and_sarif_formats(cli, project):
    write(project / "legacy.py", LEGACY)
    line = cli("check", "legacy.py", "--output-format", "github").output.strip()
    assert line.startswith("::warning title=ampmigrate (AMP201),file=legacy.py,line=3,col=6,")
    sarif = json.loads(cli("check", "legacy.py", "--output-format", "sarif").output)
    assert sarif["version"] == "2.1.0"
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "AMP201"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 3


def test_info_findings_do_not_fail_the_run(cli, project):
    write(project / "compat.py", "try:\n    from torch.amp import GradScaler\nexcept ImportError:\n    from torch.cuda.amp import GradScaler\n")
    result = cli("check", "compat.py", "--output-format", "concise")
    assert "AMP206" in result.output and result.exit_code == 0


def test_fix_writes_keeps_mode_and_reports(cli, project):
    path = write(project / "legacy.py", LEGACY)
    os.chmod(path, 0o640)
    result = cli("fix", "legacy.py")
    assert result.exit_code == 0, result.output
    assert "Fixed 1 finding in 1 file." in result.output
    assert path.read_text() == FIXED
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    again = cli("fix", "legacy.py")
    assert again.exit_code == 0 and path.read_text() == FIXED
    assert "Fixed 0 findings" in again.output


def test_fix_through_a_symlink_replaces_the_target(cli, project):
    target = write(project / "real.py", LEGACY)
    (project / "link.py").symlink_to(target)
    assert cli("fix", "link.py").exit_code == 0
    assert (project / "link.py").is_symlink() and target.read_text() == FIXED


def test_fix_diff_writes_nothing(cli, project):
    path = write(project / "legacy.py", LEGACY)
    result = cli("fix", "--diff", "legacy.py")
    assert result.exit_code == 1
    assert "-with torch.cuda.amp.autocast():" in result.output
    assert '+with torch.amp.autocast("cuda"):' in result.output
    assert path.read_text() == LEGACY
    write(project / "clean.py", CLEAN)
    assert cli("fix", "--diff", "clean.py").exit_code == 0


def test_fix_lists_what_remains(cli, project):
    # A device held in a variable in the legacy init_scale slot: no fix guesses what it holds.
    write(project / "manual.py", "import torch\ndevice = 'cuda'\nscaler = torch.cuda.amp.GradScaler(device)\n")
    result = cli("fix", "manual.py")
    assert result.exit_code == 1
    assert "manual.py:3:10: AMP202" in result.output
    assert "1 remaining (1 need a manual change)" in result.output
    # The class handed away as a value: functools.partial keeps its calls working, but they are out of sight.
    write(project / "value.py", "import torch\nregister(torch.cuda.amp.autocast)\n")
    result = cli("fix", "value.py")
    assert result.exit_code == 1
    assert "value.py:2:10: AMP201" in result.output
    assert "1 remaining (1 fixable with --unsafe-fixes)" in result.output


def test_fix_keeps_names_other_modules_import(cli, project):
    (project / ".git").mkdir()  # the repository is the scope of the import scan
    utils = write(project / "pkg" / "utils.py", "import torch\nfrom torch.cuda.amp import autocast\nctx = torch.cuda.amp.autocast\n\nwith autocast():\n    pass\n")
    write(project / "pkg" / "train.py", "from .utils import (\n    ctx,\n    autocast as ac,\n)\n\nwith ac():\n    pass\n")
    result = cli("fix", "pkg/utils.py")  # as pre-commit would call it: only the changed file
    assert result.exit_code == 1
    assert utils.read_text().count("torch.cuda.amp") == 2
    assert "pkg/utils.py:2:1: AMP208" in result.output  # the import line itself, kept for train.py
    assert "3 remaining (3 need a manual change)" in result.output

    from ampmigrate.config import Settings
    from ampmigrate.engine.pipeline import Engine
    from ampmigrate.engine.project import ProjectImports

    imports = ProjectImports.scan(str(project), [str(project / "pkg" / "train.py")])
    assert imports.imported_from(str(project / "pkg" / "utils.py")) == {"ctx", "autocast"}
    findings = Engine(Settings(), project=imports).check_text(utils.read_text(), str(utils)).findings
    assert [f.fix for f in findings] == [None, None, None]
    assert all("other modules of the project import" in f.no_fix_reason for f in findings)


def test_discovery_honours_gitignore_excludes_and_explicit_files(cli, project):
    (project / ".git").mkdir()
    write(project / ".gitignore", "generated/\n*_pb2.py\n!keep_pb2.py\n")
    for name in ("src/a.py", "generated/b.py", "src/c_pb2.py", "src/keep_pb2.py", ".venv/lib/d.py", "e.pyi", "f.txt"):
        write(project / name, LEGACY)
    write(project / "pyproject.toml", '[tool.ampmigrate]\nextend-exclude = ["src/skip*"]\n')
    write(project / "src" / "skip_me.py", LEGACY)
    out = cli("check", "--output-format", "concise").output
    checked = sorted({line.split(":")[0] for line in out.splitlines()})
    assert checked == ["e.pyi", "src/a.py", "src/keep_pb2.py"]
    explicit = cli("check", "generated/b.py", "--output-format", "concise").output
    assert explicit.startswith("generated/b.py:")


def test_missing_path_is_an_error(cli, project):
    result = cli("check", "nope.py")
    assert result.exit_code == 2
    assert "nope.py: no such file or directory" in result.output


def test_rule_command(cli):
    result = cli("rule", "AMP201")
    assert result.exit_code == 0
    assert "legacy-cuda-amp-autocast" in result.output and "Why" in result.output
    listing = cli("rule", "--all")
    assert all(code in listing.output for code in ("AMP201", "AMP207"))
    data = json.loads(cli("rule", "AMP202", "--output-format", "json").output)
    assert data[0]["fix"] == "safe"
    assert cli("rule", "AMP999").exit_code == 2


def test_python_dash_m_and_console_script_agree(tmp_path):
    path = write(tmp_path / "legacy.py", LEGACY)
    module = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", str(path), "--output-format", "concise"],
        capture_output=True, text=True,
    )
    assert module.returncode == 1 and "AMP201" in module.stdout
    version = subprocess.run([sys.executable, "-m", "ampmigrate", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "ampmigrate" in version.stdout


def test_parallel_and_serial_runs_give_identical_output(cli, project):
    for i in range(12):
        write(project / f"m{i:02d}.py", LEGACY if i % 3 else CLEAN)
    serial = cli("check", "-j", "1", "--output-format", "concise").output
    parallel = cli("check", "-j", "2", "--output-format", "concise").output
    assert serial == parallel and serial.count("AMP201") == 8


def test_an_internal_error_exits_2_with_one_line(cli, project, monkeypatch):
    write(project / "legacy.py", LEGACY)

    def explode(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("ampmigrate.cli.run_files", explode)
    result = cli("check", "legacy.py")
    assert result.exit_code == 2
    assert result.output.strip() == "error: internal error: RuntimeError: disk on fire"
