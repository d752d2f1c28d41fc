"""Bad input, end to end: the real command line on a directory of everything that goes wrong.

`check` must report each problem once, on stderr, in one line naming the file; check every
other file; and exit 2. `fix` must change only the fixable files, byte for byte as expected
(encodings, BOM, CRLF and tabs kept), and leave every other file exactly as it was.
"""

from __future__ import annotations

import codecs
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import ROOT

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

# Legacy code every fixable file carries, and what `fix` turns it into (safe fixes).
LEGACY = (
    "import torch\n"
    "\n"
    "\n"
    "def train(model, loader, optimizer):\n"
    "    scaler = torch.cuda.amp.GradScaler()\n"
    "    for inputs in loader:\n"
    "        with torch.cuda.amp.autocast():\n"
    '            loss = model(inputs).sum()  # "mean" was unstable\n'
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
)


FLOAT16_PROJECT = '[tool.ampmigrate]\ntarget-dtype = "float16"\n'


def fixed(text: str) -> str:
    return text.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")').replace(
        "torch.cuda.amp.autocast()", 'torch.amp.autocast("cuda")'
    )


LATIN1 = (
    "# -*- coding: latin-1 -*-\n"
    "# Entraînement du modèle (données: café, crème brûlée)\n"
    + LEGACY
    + 'LABEL = "réseau"\n'
)
TABS = (
    "import torch\n"
    "\n"
    "def train_tabs(model, x):\n"
    "\twith torch.cuda.amp.autocast():\n"
    "\t\treturn model(x)\n"
    "\n"
    "def train_spaces(model, x):\n"
    "    scaler = torch.cuda.amp.GradScaler()\n"
    "    return scaler\n"
)
MODERN = 'import torch\n\nwith torch.amp.autocast("cuda"):\n    pass\n'


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ampmigrate", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _snapshot(top: Path) -> Dict[str, bytes]:
    """The bytes of every regular, readable file under `top` (symlinks not followed)."""
    files = {}
    for directory, dirs, names in os.walk(top):
        for name in names:
            path = Path(directory, name)
            if path.is_symlink() or not path.is_file() or not os.access(path, os.R_OK):
                continue
            files[path.relative_to(top).as_posix()] = path.read_bytes()
    return files


@pytest.fixture
def bad_tree(tmp_path) -> Path:
    # A V100-fleet project: float16 stays, so the legacy files' fixes are the safe AMP2 respelling.
    (tmp_path / "pyproject.toml").write_text(FLOAT16_PROJECT, encoding="utf-8")
    d = tmp_path / "d"
    d.mkdir()
    (d / "syntax_error.py").write_text(LEGACY + "def broken(:\n    pass\n", encoding="utf-8")
    (d / "latin1.py").write_bytes(LATIN1.encode("latin-1"))
    (d / "bom.py").write_bytes(codecs.BOM_UTF8 + ("# é\n" + LEGACY).encode("utf-8"))
    (d / "crlf.py").write_bytes(LEGACY.replace("\n", "\r\n").encode("utf-8"))
    (d / "tabs.py").write_text(TABS, encoding="utf-8")
    (d / "good.py").write_text(LEGACY, encoding="utf-8")
    (d / "modern.py").write_text(MODERN, encoding="utf-8")
    # A 5 MB generated file that matches the rules' pre-filter: over max-file-size (2 MiB).
    lines = [LEGACY] + [f"WEIGHT_{i} = {i * 0.5!r}  # generated\n" for i in range(150_000)]
    (d / "generated.py").write_text("".join(lines), encoding="utf-8")
    assert 5_000_000 < (d / "generated.py").stat().st_size < 5.5 * 1024 * 1024
    (d / "loop").symlink_to(".")
    (d / "dangling.py").symlink_to("missing.py")
    (d / "binary.py").write_bytes(bytes(range(256)) * 16)  # NUL bytes
    (d / "image.py").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(1, 256)) * 4)  # invalid UTF-8, no NUL
    # Generated code too deep for the recursive name pass: a chain of 1000 additions.
    (d / "deep.py").write_text(LEGACY + "TOTAL = " + " + ".join(["w"] * 1000) + "\n", encoding="utf-8")
    models = d / "models.py"  # a directory with a .py name: walked, not read
    models.mkdir()
    (models / "inner.py").write_text(LEGACY, encoding="utf-8")
    if hasattr(os, "mkfifo"):
        os.mkfifo(d / "pipe.py")
    if not IS_ROOT:
        (d / "unreadable.py").write_text(LEGACY, encoding="utf-8")
        (d / "unreadable.py").chmod(0)
    yield d
    if not IS_ROOT:
        (d / "unreadable.py").chmod(0o644)


def _expected_errors() -> Dict[str, str]:
    errors = {
        "d/syntax_error.py": "syntax error at 12:12: invalid syntax",
        "d/generated.py": "skipped: 5.2 MiB exceeds max-file-size (2.0 MiB)",
        "d/loop": "symlink loop; directory skipped",
        "d/dangling.py": "broken symlink (its target 'missing.py' does not exist)",
        "d/binary.py": "contains NUL bytes; not a Python source file",
        "d/deep.py": "too deeply nested to analyse (e.g. a chain of hundreds of operators); skipped",
        "d/image.py": "not valid utf-8 text at byte 0 (invalid start byte)",
    }
    if hasattr(os, "mkfifo"):
        errors["d/pipe.py"] = "not a regular file (a pipe, socket or device)"
    if not IS_ROOT:
        errors["d/unreadable.py"] = "cannot read file: Permission denied"
    return errors


FIXABLE = ("bom.py", "crlf.py", "good.py", "latin1.py", "models.py/inner.py", "tabs.py")


def _error_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_check_reports_each_problem_once_and_checks_everything_else(bad_tree):
    result = _run(bad_tree.parent, "check", "--output-format", "concise", "d")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _error_lines(result.stderr)
    expected = _expected_errors()
    assert sorted(lines) == sorted(f"error: {path}: {message}" for path, message in expected.items())
    for path in expected:
        assert sum(path + ":" in line for line in lines) == 1, path  # once, and never a traceback

    flagged = {line.split(":", 1)[0] for line in result.stdout.splitlines()}
    assert flagged == {f"d/{name}" for name in FIXABLE}
    # Rows and columns count the file's own lines: the Latin-1 file has two header lines.
    assert "d/latin1.py:7:14: AMP202" in result.stdout
    assert "d/crlf.py:5:14: AMP202" in result.stdout
    assert "d/tabs.py:4:7: AMP201" in result.stdout


def test_check_full_output_counts_the_files_it_could_not_check(bad_tree):
    result = _run(bad_tree.parent, "check", "d")
    assert result.returncode == 2
    assert f"{len(_expected_errors())} files could not be checked." in result.stdout


def test_fix_changes_only_the_fixable_files_and_keeps_their_encodings(bad_tree):
    before = _snapshot(bad_tree)
    result = _run(bad_tree.parent, "fix", "d")
    assert result.returncode == 2, result.stdout + result.stderr  # files could not be checked
    assert f"Fixed {2 * len(FIXABLE)} findings in {len(FIXABLE)} files." in result.stdout
    assert sorted(_error_lines(result.stderr)) == sorted(
        f"error: {path}: {message}" for path, message in _expected_errors().items()
    )
    after = _snapshot(bad_tree)
    assert sorted(after) == sorted(before)  # no file added (no temporary left) or removed
    changed = sorted(name for name in before if before[name] != after[name])
    assert changed == sorted(FIXABLE)

    assert after["good.py"] == fixed(LEGACY).encode("utf-8")
    assert after["models.py/inner.py"] == fixed(LEGACY).encode("utf-8")
    assert after["latin1.py"] == fixed(LATIN1).encode("latin-1")  # still Latin-1, cookie kept
    assert after["bom.py"] == codecs.BOM_UTF8 + ("# é\n" + fixed(LEGACY)).encode("utf-8")
    assert after["crlf.py"] == fixed(LEGACY).replace("\n", "\r\n").encode("utf-8")
    assert after["tabs.py"] == fixed(TABS).encode("utf-8")

    # Fixing again changes nothing, and the fixed files are clean.
    again = _run(bad_tree.parent, "fix", "d")
    assert "Fixed 0 findings in 0 files." in again.stdout
    assert _snapshot(bad_tree) == after
    recheck = _run(bad_tree.parent, "check", "--output-format", "concise", *(f"d/{name}" for name in FIXABLE))
    assert recheck.returncode == 0 and recheck.stdout == "" and recheck.stderr == ""


def test_fix_diff_writes_nothing(bad_tree):
    before = _snapshot(bad_tree)
    result = _run(bad_tree.parent, "fix", "--diff", "d")
    assert result.returncode == 2
    assert "+    scaler = torch.amp.GradScaler(\"cuda\")" in result.stdout
    assert _snapshot(bad_tree) == before


def test_syntax_errors_are_reported_only_where_a_rule_could_look(tmp_path):
    # The pre-filter decides before parsing: a file no rule's trigger matches cannot hold a
    # finding, so it is never parsed, and its syntax error is not ampmigrate's to report.
    (tmp_path / "unrelated.py").write_text("def broken(:\n    pass\n", encoding="utf-8")
    (tmp_path / "related.py").write_text("import torch.cuda.amp\ndef broken(:\n    pass\n", encoding="utf-8")
    result = _run(tmp_path, "check", "--output-format", "concise", ".")
    assert result.returncode == 2
    assert _error_lines(result.stderr) == ["error: related.py: syntax error at 2:12: invalid syntax"]


def test_an_engine_bug_in_one_file_is_that_files_error_not_the_runs(tmp_path, monkeypatch, cli):
    from ampmigrate.engine.pipeline import Engine

    real_check = Engine.check_text

    def flaky(self, text, path, **kwargs):
        if path.endswith("boom.py"):
            raise ValueError("simulated engine bug")
        return real_check(self, text, path, **kwargs)

    monkeypatch.setattr(Engine, "check_text", flaky)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(FLOAT16_PROJECT, encoding="utf-8")
    Path("boom.py").write_text(LEGACY, encoding="utf-8")
    Path("good.py").write_text(LEGACY, encoding="utf-8")
    result = cli("check", "--output-format", "concise", "boom.py", "good.py")
    assert result.exit_code == 2
    assert "error: boom.py: internal error: ValueError: simulated engine bug" in result.stderr
    assert result.stdout.count("good.py:") == 2
