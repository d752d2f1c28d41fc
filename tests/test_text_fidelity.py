"""Focused regression tests for what the round-trip sweep and the bad-input tests turned up.

- Rows are Python's lines (CRLF, CR, LF), not `str.splitlines`' (which also breaks at form
  feeds, U+2028 and friends): noqa comments, the `full` format's source line, and JSON/SARIF
  edit positions depend on it.
- libcst does not render every module exactly as it read it (a form feed before the first
  statement, the last CR of a CR-only file): fixes are spliced into the original text.
- Syntax errors are reported with CPython's message and position.
- Discovery survives file symlink loops and named pipes, and checks a file reached through
  several paths (a symlink to it) once, so that `fix` does not write it twice.
- An import added by a fix keeps the blank lines that set the next statement apart.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest

from ampmigrate.config import Settings
from ampmigrate.discovery import discover
from ampmigrate.engine import fixer
from ampmigrate.engine.pipeline import Engine
from ampmigrate.source import SourceError, SourceFile, split_lines

from conftest import check, codes, fix

LEGACY = "import torch\n\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n"
FIXED = 'import torch\n\nscaler = torch.amp.GradScaler("cuda")\nwith torch.amp.autocast("cuda"):\n    pass\n'


# ---------------------------------------------------------------------------------- lines
def test_split_lines_breaks_only_where_python_does():
    text = 'a = "\x0c\u2028\x1c\x85"\r\nb\rc\nd'
    assert split_lines(text) == ['a = "\x0c\u2028\x1c\x85"', "b", "c", "d"]
    assert split_lines(text, keepends=True) == ['a = "\x0c\u2028\x1c\x85"\r\n', "b\r", "c\n", "d"]
    assert split_lines("x\n") == ["x"] and split_lines("") == []


def test_noqa_rows_in_a_cr_only_file():
    text = "import torch\rx = 1\rwith torch.cuda.amp.autocast():  # noqa: AMP201\r    pass\r"
    assert check(text) == []
    findings = check(text.replace("AMP201", "AMP202"))
    # AMP001: the AMP202 of that noqa suppresses nothing (reported on the same row).
    assert codes(findings) == ["AMP201", "AMP001"] and [f.location.row for f in findings] == [3, 3]


@pytest.mark.parametrize("odd", ["\x0c", "\u2028", "\x1d", "\x85"])
def test_source_line_after_characters_splitlines_would_break_at(odd):
    text = f'import torch\nNOTE = "{odd}"\nwith torch.cuda.amp.autocast():\n    pass\n'
    (finding,) = check(text)
    assert finding.location.row == 3
    assert finding.source_line == "with torch.cuda.amp.autocast():"


def test_text_edits_count_rows_in_cr_only_text():
    (edit,) = fixer.text_edits("a = 1\rb = cuda\r", "a = 1\rb = cpu\r")
    assert (edit.location.row, edit.location.column, edit.end_location.column, edit.content) == (2, 6, 9, "pu")


# ---------------------------------------------------------------------------------- libcst round trip
@pytest.mark.parametrize(
    "before,after",
    [
        ("\x0c" + LEGACY, "\x0c" + FIXED),  # a form feed before the first statement
        ("\x0c\x0c" + LEGACY, "\x0c\x0c" + FIXED),
        (LEGACY.replace("\n", "\r"), FIXED.replace("\n", "\r")),  # CR-only: the last CR
    ],
    ids=["form-feed", "two-form-feeds", "cr-only"],
)
def test_fix_keeps_bytes_libcst_does_not_render(before, after):
    assert cst.parse_module(before).code != before  # the libcst behaviour this guards against
    assert fix(before) == after
    assert Engine(Settings()).fix_text(after, "example.py").new_text is None  # idempotent


def test_check_edits_are_positions_in_the_original_text():
    text = "\x0c" + LEGACY
    findings = Engine(Settings()).check_text(text, "example.py", want_edits=True).findings
    (edit,) = findings[0].fix.edits
    assert (edit.location.row, edit.location.column) == (3, 16)
    assert split_lines(text)[2][15:35] == "cuda.amp.GradScaler("


def test_splice_refuses_a_change_that_overlaps_what_libcst_dropped():
    assert fixer.splice("x\x0cy\n", "xy\n", "z\n") is None
    assert fixer.splice("x\r", "x", "y") == "y\r"
    assert fixer.splice("\x0cx = 1\n", "x = 1\n", "x = 2\n") == "\x0cx = 2\n"
    assert fixer.splice("a\n", "a\n", "b\n") == "b\n"
    assert fixer.splice("\x0ca\n", "a\n", "a\n") == "\x0ca\n"


# ---------------------------------------------------------------------------------- syntax errors
@pytest.mark.parametrize(
    "code,message",
    [
        ("def f(:\n    pass\n", "syntax error at 2:7: invalid syntax"),
        ("x = (1,\n", "syntax error at 2:5: '(' was never closed"),
        ("if x:\n\ty = 1\n        z = 2\n", "syntax error at 4:1: inconsistent use of tabs and spaces in indentation"),
        ("print 'hi'\n", "syntax error at 2:1: Missing parentheses in call to 'print'. Did you mean print(...)?"),
    ],
)
def test_syntax_errors_use_cpythons_message_and_position(code, message):
    result = Engine(Settings()).check_text("import torch.cuda.amp\n" + code, "bad.py")
    assert [e.message for e in result.errors] == [message]


# ---------------------------------------------------------------------------------- reading
def test_binary_without_a_coding_cookie_is_reported_as_not_utf8(tmp_path):
    path = tmp_path / "image.py"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x01\x02")
    with pytest.raises(SourceError, match=r"^not valid utf-8 text at byte 0 \(invalid start byte\)$"):
        SourceFile.read(str(path))


def test_a_bad_coding_cookie_is_named(tmp_path):
    path = tmp_path / "cookie.py"
    path.write_bytes(b"# -*- coding: no-such-codec -*-\nx = 1\n")
    with pytest.raises(SourceError, match="^bad encoding declaration: unknown encoding: no-such-codec$"):
        SourceFile.read(str(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    with pytest.raises(SourceError, match="not a regular file"):
        SourceFile.read(str(tmp_path / "pipe.py"))  # would block forever if opened blocking
    found = discover([str(tmp_path)], Settings(root=str(tmp_path)))
    assert found.files == []
    assert [(Path(e.path).name, e.message) for e in found.errors] == [
        ("pipe.py", "not a regular file (a pipe, socket or device)")
    ]


# ---------------------------------------------------------------------------------- discovery
def test_a_file_symlink_loop_is_reported_not_a_crash(tmp_path):
    (tmp_path / "a.py").symlink_to("b.py")
    (tmp_path / "b.py").symlink_to("a.py")
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    found = discover([str(tmp_path)], Settings(root=str(tmp_path)))
    assert [Path(f).name for f in found.files] == ["ok.py"]
    assert sorted((Path(e.path).name, e.message) for e in found.errors) == [
        ("a.py", "symlink loop"),
        ("b.py", "symlink loop"),
    ]


def test_a_dangling_symlink_names_its_target(tmp_path):
    (tmp_path / "gone.py").symlink_to("missing.py")
    found = discover([str(tmp_path)], Settings(root=str(tmp_path)))
    assert [e.message for e in found.errors] == ["broken symlink (its target 'missing.py' does not exist)"]


def test_a_file_reached_through_several_paths_is_checked_and_fixed_once(tmp_path, monkeypatch, cli):
    real = tmp_path / "src"
    real.mkdir()
    (real / "train.py").write_text(LEGACY, encoding="utf-8")
    (tmp_path / "alias").symlink_to("src")  # a symlinked directory
    (tmp_path / "train_link.py").symlink_to("src/train.py")  # a symlinked file
    monkeypatch.chdir(tmp_path)
    found = discover(["."], Settings(root=str(tmp_path)))
    assert [Path(f).as_posix() for f in found.files] == ["alias/train.py"]

    result = cli("check", "--output-format", "concise", ".", "src/train.py", "train_link.py")
    assert result.exit_code == 1
    assert len(result.stdout.splitlines()) == 2  # two findings, not six
    result = cli("fix", ".")
    assert result.exit_code == 0, result.output  # no "changed on disk" conflict
    assert (real / "train.py").read_text(encoding="utf-8") == FIXED
    assert (tmp_path / "train_link.py").is_symlink()


# ---------------------------------------------------------------------------------- added imports
def test_an_added_import_keeps_the_blank_lines_before_a_class():
    text = (
        '"""Doc."""\n'
        "from __future__ import annotations\n"
        "\n"
        "\n"
        "class Trainer:\n"
        "    def step(self, model, x):\n"
        "        from torch import cuda\n"
        "        with cuda.amp.autocast():\n"
        "            return model(x)\n"
    )
    assert fix(text) == (
        '"""Doc."""\n'
        "from __future__ import annotations\n"
        "\n"
        "import torch\n"
        "\n"
        "\n"
        "class Trainer:\n"
        "    def step(self, model, x):\n"
        "        from torch import cuda\n"
        '        with torch.amp.autocast("cuda"):\n'
        "            return model(x)\n"
    )


def test_an_added_import_goes_below_a_licence_comment():
    text = (
        "# Copyright (c) Someone.\n"
        "# Licensed under MIT.\n"
        "\n"
        "def train(model, x):\n"
        "    from torch import cuda\n"
        "    with cuda.amp.autocast():\n"
        "        return model(x)\n"
    )
    assert fix(text) == (
        "# Copyright (c) Someone.\n"
        "# Licensed under MIT.\n"
        "\n"
        "import torch\n"
        "\n"
        "def train(model, x):\n"
        "    from torch import cuda\n"
        '    with torch.amp.autocast("cuda"):\n'
        "        return model(x)\n"
    )
