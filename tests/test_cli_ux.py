"""Issue 15's command-line habits: paths under excluded folders, empty runs, broken configuration,
standalone configuration files, per-file-ignores, extend-exclude, stale noqa comments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ampmigrate.config import ConfigError, load_settings
from test_cli import LEGACY, project, write  # noqa: F401 - `project` is a fixture


def concise(cli, *args):
    return cli("check", "--no-cache", "--output-format", "concise", *args)


def test_a_directory_named_below_an_excluded_one_is_checked(cli, project):
    write(project / "venv" / "myproj" / "train.py", LEGACY)
    write(project / "venv" / "myproj" / "dist" / "gen.py", LEGACY)  # excluded by name inside it
    result = concise(cli, "venv/myproj")
    assert result.exit_code == 1
    assert [line.split(" ")[0] for line in result.output.splitlines()] == ["venv/myproj/train.py:3:6:"]
    # ...but a plain run from the top still skips the virtual environment,
    assert concise(cli).exit_code == 0
    # and --force-exclude applies the excludes to the named paths too.
    forced = concise(cli, "--force-exclude", "venv/myproj")
    assert forced.exit_code == 0
    assert "No Python files found" in forced.stderr


def test_force_exclude_skips_an_excluded_file_named_explicitly(cli, project):
    write(project / "site-packages" / "x.py", LEGACY)
    assert concise(cli, "site-packages/x.py").exit_code == 1
    assert concise(cli, "--force-exclude", "site-packages/x.py").exit_code == 0


def test_a_gitignored_directory_named_explicitly_is_checked(cli, project):
    (project / ".git").mkdir()
    write(project / ".gitignore", "generated/\n")
    write(project / "generated" / "t.py", LEGACY)
    assert concise(cli).exit_code == 0
    assert concise(cli, "generated").exit_code == 1


def test_no_python_files_is_a_warning(cli, project):
    (project / "empty").mkdir()
    result = concise(cli, "empty")
    assert result.exit_code == 0
    assert "warning: No Python files found under the given path(s)" in result.stderr


def test_invalid_toml_is_an_error_naming_file_and_line(cli, project):
    write(project / "pyproject.toml", "[project]\nname = 'x'\n[tool.ampmigrate\nselect = ['AMP2']\n")
    write(project / "x.py", LEGACY)
    result = concise(cli, "x.py")
    assert result.exit_code == 2
    assert "pyproject.toml: invalid TOML" in result.stderr and "line 3" in result.stderr
    with pytest.raises(ConfigError, match="line 3"):
        load_settings(start=str(project))


def test_standalone_configuration_files(cli, project):
    write(project / "x.py", "import torch\ns = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n")
    write(project / "pyproject.toml", "[tool.ampmigrate]\nselect = ['AMP202']\n")
    assert [l.split()[1] for l in concise(cli, "x.py").output.splitlines()] == ["AMP202"]
    write(project / "ampmigrate.toml", "select = ['AMP201']\n")  # beats pyproject.toml
    assert [l.split()[1] for l in concise(cli, "x.py").output.splitlines()] == ["AMP201"]
    write(project / ".ampmigrate.toml", "ignore = ['AMP2']\n")  # beats ampmigrate.toml
    assert concise(cli, "x.py").output == ""
    write(project / ".ampmigrate.toml", "colour = 'red'\n")
    result = concise(cli, "x.py")
    assert result.exit_code == 2 and ".ampmigrate.toml: unknown key 'colour'" in result.stderr


def test_per_file_ignores_and_extend_exclude(cli, project):
    write(project / "tests" / "test_x.py", LEGACY)
    write(project / "legacy" / "old.py", LEGACY)
    write(project / "main.py", LEGACY)
    write(
        project / "pyproject.toml",
        '[tool.ampmigrate]\nextend-exclude = ["legacy"]\n[tool.ampmigrate.per-file-ignores]\n"tests/*" = ["AMP2"]\n',
    )
    result = concise(cli)
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["main.py"]
    write(project / "pyproject.toml", '[tool.ampmigrate.per-file-ignores]\n"tests/*" = ["AMP9"]\n')
    assert "unknown rule code or prefix 'AMP9'" in concise(cli).stderr


def test_unused_and_unknown_noqa_are_reported_and_fixed(cli, project):
    path = write(project / "x.py", "import torch\nwith torch.amp.autocast('cuda'):  # noqa: AMP999, E501\n    pass\n")
    result = concise(cli, "x.py")
    assert result.exit_code == 0  # informational
    assert "x.py:2:35: AMP001 [*] Unused `noqa` suppression: unknown rule code AMP999" in result.output
    assert cli("fix", "--no-cache", "x.py").exit_code == 0
    assert path.read_text() == "import torch\nwith torch.amp.autocast('cuda'):  # noqa: E501\n    pass\n"


def test_verify_does_not_import_the_cli():
    code = "import sys, ampmigrate.verify.command; print('ampmigrate.cli' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
