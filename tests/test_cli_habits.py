"""ruff habits: stdin, `check --fix`, --statistics, --show-fixes, --add-noqa, --watch, output width,
`rule --all` at 80 columns, one note per shared fix, a progress bar that counts bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampmigrate.cli import _Progress
from ampmigrate.engine.noqa_writer import with_noqa
from test_cli import project  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
LEGACY = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\ns = torch.cuda.amp.GradScaler()\n"
FIXED = 'import torch\n\nwith torch.amp.autocast("cuda"):\n    pass\ns = torch.amp.GradScaler("cuda")\n'


def test_check_reads_standard_input(cli, project):
    (project / "pyproject.toml").write_text('[tool.ampmigrate.per-file-ignores]\n"legacy/*" = ["AMP202"]\n')
    result = cli("check", "-", "--output-format", "concise", "--stdin-filename", "src/train.py", input=LEGACY)
    assert result.exit_code == 1
    assert [line.split(" ")[0:2] for line in result.output.splitlines()] == [
        ["src/train.py:3:6:", "AMP201"],
        ["src/train.py:5:5:", "AMP202"],
    ]
    # The stdin file name chooses the per-file-ignores.
    ignored = cli("check", "-", "--output-format", "concise", "--stdin-filename", "legacy/t.py", input=LEGACY)
    assert [line.split(" ")[1] for line in ignored.output.splitlines()] == ["AMP201"]
    assert cli("check", "-", "x.py", input=LEGACY).exit_code == 2


def test_fix_reads_standard_input_and_writes_the_result_to_stdout(cli, project):
    result = cli("fix", "-", input=LEGACY)
    assert result.exit_code == 0
    assert result.stdout == FIXED
    assert "Fixed 2 findings" in result.stderr
    assert cli("fix", "--stdin-filename", "t.py", input=LEGACY).stdout == FIXED  # no PATHS: stdin
    clean = cli("fix", "-", input=FIXED)
    assert clean.stdout == FIXED and clean.exit_code == 0


def test_fix_from_stdin_keeps_the_encoding(cli, project):
    text = "# -*- coding: latin-1 -*-\n# café\n" + LEGACY
    result = cli("fix", "-", input=text.encode("latin-1"))
    assert result.stdout_bytes == ("# -*- coding: latin-1 -*-\n# café\n" + FIXED).encode("latin-1")


def test_check_fix_is_fix(cli, project):
    path = project / "t.py"
    path.write_text(LEGACY)
    result = cli("check", "--fix", "--no-cache", "--show-fixes")
    assert result.exit_code == 0
    assert path.read_text() == FIXED
    assert "Fixed 2 findings in 1 file." in result.output
    assert "Fixes applied:\nt.py:\n    1 × AMP201\n    1 × AMP202\n" in result.output
    # --unsafe-fixes goes along: `check --fix --unsafe-fixes` is `fix --unsafe-fixes`.
    path.write_text((ROOT / "tests" / "fixtures" / "AMP401" / "explicit_dtype.py").read_text())
    cli("check", "--fix", "--no-cache", "--select", "AMP401")
    assert "torch.bfloat16" not in path.read_text()  # AMP401's fix is unsafe
    cli("check", "--fix", "--no-cache", "--select", "AMP401", "--unsafe-fixes")
    assert "torch.bfloat16" in path.read_text()


def test_check_unsafe_fixes_is_fix_unsafe_fixes(cli, project):
    path = project / "t.py"
    path.write_text((ROOT / "tests" / "fixtures" / "AMP401" / "explicit_dtype.py").read_text())
    result = cli("check", "--no-cache", "--select", "AMP401", "--unsafe-fixes")
    assert "Fixed" in result.output
    assert "torch.bfloat16" in path.read_text()


def test_statistics(cli, project):
    (project / "a.py").write_text(LEGACY)
    (project / "b.py").write_text("import torch\ns = torch.cuda.amp.GradScaler()\n")
    result = cli("check", "--statistics", "--no-cache")
    assert result.exit_code == 1
    assert result.output.splitlines()[:3] == [
        "2\tAMP202\t[*] legacy-cuda-amp-grad-scaler",
        "1\tAMP201\t[*] legacy-cuda-amp-autocast",
        "Found 3 findings.",
    ]


def test_add_noqa(cli, project):
    text = 'import torch\nwith torch.cuda.amp.autocast():  # train\n    x = """\n""" + str(torch.cuda.amp.GradScaler())\ns = torch.cuda.amp.GradScaler()  # noqa: E501\n'
    (project / "t.py").write_text(text)
    result = cli("check", "--add-noqa", "--no-cache")
    assert result.exit_code == 0 and "Added 3 noqa directives." in result.output
    assert (project / "t.py").read_text() == (
        'import torch\nwith torch.cuda.amp.autocast():  # train  # noqa: AMP201\n    x = """\n""" + str(torch.cuda.amp.GradScaler())  # noqa: AMP202\n'
        "s = torch.cuda.amp.GradScaler()  # noqa: E501, AMP202\n"
    )
    assert cli("check", "--no-cache").exit_code == 0


def test_add_noqa_skips_lines_it_cannot_end_with_a_comment():
    text = 'x = """a\nb""" ; y = 1\nz = 1 + \\\n    2\n'
    new, count, skipped = with_noqa(text, {1: {"AMP201"}, 2: {"AMP201"}, 3: {"AMP202"}})
    assert skipped == [1, 3] and count == 1
    assert new == 'x = """a\nb""" ; y = 1  # noqa: AMP201\nz = 1 + \\\n    2\n'


def test_full_output_is_not_wrapped_and_a_shared_fix_is_described_once(cli, project):
    (project / "t.py").write_text("from torch.cuda.amp import autocast\nwith autocast():\n    pass\nwith autocast():\n    pass\n")
    output = cli("check", "--no-cache").output
    long_line = [line for line in output.splitlines() if "AMP201" in line][0]
    assert len(long_line) > 120  # one line, whatever its length
    assert output.count("= fix:") == 1
    assert output.count("AMP201") == 2  # two findings, one migration of the import and its uses


def test_rule_list_fits_80_columns():
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "ampmigrate", "rule", "--all"], capture_output=True, text=True, env=env, check=True).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "AMP201 legacy-cuda-amp-autocast  (fix: safe, warning)" in out


def test_progress_counts_bytes_and_stays_below_100_while_files_are_left(tmp_path, monkeypatch):
    small, large = tmp_path / "s.py", tmp_path / "l.py"
    small.write_text("x" * 10)
    large.write_text("x" * 990)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)  # a bar is shown on a terminal only
    progress = _Progress([str(small), str(large)])
    assert progress.enabled
    monkeypatch.setattr(progress, "start", float("inf"))  # no bar drawn during the test

    class Done:
        def __init__(self, path):
            self.path = path

    progress(Done(str(large)))
    assert progress.completed == 990 and progress.completed / progress.total < 0.995
    progress(Done(str(small)))
    assert progress.completed == progress.total == 1000


def test_amp401_tells_older_gpus_how_to_keep_float16(cli, project):
    (project / "t.py").write_text((ROOT / "tests" / "fixtures" / "AMP401" / "explicit_dtype.py").read_text())
    output = cli("check", "--no-cache", "--output-format", "concise", "--select", "AMP401").output
    findings = output.count(": AMP401 ")
    assert findings >= 1
    assert output.count('V100/T4 fleets (no fast bfloat16) keep float16 with `target-dtype = "float16"`') == findings
    assert cli("check", "--no-cache", "--select", "AMP401", "--target-dtype", "float16").exit_code == 0


@pytest.mark.slow
def test_watch_checks_again_when_a_file_changes(project):
    path = project / "t.py"
    path.write_text("x = 1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "ampmigrate", "check", "--watch", "--no-cache", "--output-format", "concise", "."]
    process = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 60
        wrote = False
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "Watching for changes" in line and not wrote:
                time.sleep(1.0)
                path.write_text(LEGACY)
                wrote = True
            if "t.py:3:6: AMP201" in line:
                break
        assert any("checking again" in line for line in lines), lines
        assert any("t.py:3:6: AMP201" in line for line in lines), lines
    finally:
        process.terminate()
        process.wait(timeout=10)
