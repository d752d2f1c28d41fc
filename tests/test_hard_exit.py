"""As the program's entry (`cli.run`: the console script and `python -m ampmigrate`), the CLI
ends its process without the interpreter's finalization: everything written must still be
there, the exit status the command's, and `main` called from Python (click's CliRunner, a
script catching SystemExit: tests/test_warm_start.py) must return or raise as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampmigrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # subprocesses that run the CLI end to end

LEGACY = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"


def _run(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "ampmigrate", *args], cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )


def test_all_output_is_written_and_the_status_kept(tmp_path):
    for i in range(150):
        (tmp_path / f"m{i:03d}.py").write_text(LEGACY * 20)
    done = _run("check", ".", "--output-format", "json", "--no-cache", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)  # the whole document: flushed before the process ended
    assert len(findings) == 150 * 20
    assert _run("check", ".", "--exit-zero", "--no-cache", "--output-format", "concise", cwd=tmp_path).returncode == 0
    assert _run("nonsense", cwd=tmp_path).returncode == 2


def test_a_call_from_python_returns(tmp_path):
    (tmp_path / "m.py").write_text(LEGACY)
    result = CliRunner().invoke(main, ["check", str(tmp_path / "m.py"), "--no-cache"])
    assert result.exit_code == 1 and "AMP201" in result.output  # and this process goes on
