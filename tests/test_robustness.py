"""Bad input gets one clear line naming the file, the run goes on, and fix never loses a byte."""

from __future__ import annotations

import os
import stat

import pytest

from ampmigrate.config import Settings
from ampmigrate.engine.runner import Job, process_file, run_files, write_changes
from ampmigrate.engine.pipeline import Engine
from ampmigrate.source import SourceError, SourceFile, write_atomic

LEGACY = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"


def _fix_file(path):
    result = run_files([str(path)], Settings(), Job("fix"), jobs=1)
    errors = write_changes(result)
    return result, errors


def test_crlf_is_kept_on_untouched_and_touched_lines(tmp_path):
    path = tmp_path / "crlf.py"
    path.write_bytes(LEGACY.replace("\n", "\r\n").encode())
    _fix_file(path)
    assert path.read_bytes() == b'import torch\r\nwith torch.amp.autocast("cuda"):\r\n    pass\r\n'


def test_mixed_line_endings_survive(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_bytes(b"import torch\r\nwith torch.cuda.amp.autocast():\n    x = 1\r\n")
    _fix_file(path)
    assert path.read_bytes() == b'import torch\r\nwith torch.amp.autocast("cuda"):\n    x = 1\r\n'


def test_bom_is_kept(tmp_path):
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + LEGACY.encode())
    result, _ = _fix_file(path)
    assert result.findings == [] and result.fixed == 1
    assert path.read_bytes().startswith(b"\xef\xbb\xbfimport torch\n")


def test_latin1_with_coding_cookie_round_trips(tmp_path):
    path = tmp_path / "latin1.py"
    text = "# -*- coding: latin-1 -*-\n# Gr\xfc\xdfe\n" + LEGACY
    path.write_bytes(text.encode("latin-1"))
    _fix_file(path)
    data = path.read_bytes()
    assert b"Gr\xfc\xdfe" in data and b'torch.amp.autocast("cuda")' in data


def test_tabs_for_indentation(tmp_path):
    path = tmp_path / "tabs.py"
    path.write_bytes(b"import torch\nif True:\n\twith torch.cuda.amp.autocast():\n\t\tpass\n")
    _fix_file(path)
    assert path.read_bytes() == b'import torch\nif True:\n\twith torch.amp.autocast("cuda"):\n\t\tpass\n'


def test_empty_file_is_clean(tmp_path):
    path = tmp_path / "empty.py"
    path.write_bytes(b"")
    result = run_files([str(path)], Settings(), Job("check"), jobs=1)
    assert result.findings == [] and result.all_errors == []


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"import torch.cuda.amp\n\xff\xfe = 1\n", "not valid utf-8 text at byte"),
        (b"# coding: klingon\nimport torch\n", "bad encoding declaration"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "NUL bytes"),
    ],
)
def test_undecodable_files_are_one_error(tmp_path, data, expected):
    path = tmp_path / "bad.py"
    path.write_bytes(data)
    result = process_file(Engine(Settings()), str(path), Job("check"))
    assert len(result.errors) == 1 and expected in result.errors[0].message
    assert result.errors[0].path == str(path)


def test_syntax_error_does_not_stop_the_other_files(tmp_path):
    bad = tmp_path / "a_bad.py"
    bad.write_text("import torch.cuda.amp\ndef f(:\n")
    good = tmp_path / "b_good.py"
    good.write_text(LEGACY)
    result = run_files([str(bad), str(good)], Settings(), Job("check"), jobs=1)
    assert [e.path for e in result.all_errors] == [str(bad)]
    assert [f.code for f in result.findings] == ["AMP201"]


def test_vanished_and_unreadable_files(tmp_path):
    gone = tmp_path / "gone.py"
    result = process_file(Engine(Settings()), str(gone), Job("check"))
    assert "cannot read file" in result.errors[0].message
    directory = tmp_path / "dir.py"
    directory.mkdir()
    assert "is a directory" in process_file(Engine(Settings()), str(directory), Job("check")).errors[0].message
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.py"
        locked.write_text(LEGACY)
        locked.chmod(0)
        assert "Permission denied" in process_file(Engine(Settings()), str(locked), Job("check")).errors[0].message


def test_file_changed_between_read_and_write_is_not_overwritten(tmp_path):
    path = tmp_path / "racy.py"
    path.write_text(LEGACY)
    result = run_files([str(path)], Settings(), Job("fix"), jobs=1)
    path.write_text(LEGACY + "# edited meanwhile\n")
    errors = write_changes(result)
    assert len(errors) == 1 and "changed on disk" in errors[0].message
    assert path.read_text().endswith("# edited meanwhile\n")


def test_write_atomic_keeps_mode_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "x.py"
    path.write_bytes(b"old\n")
    path.chmod(0o751)
    write_atomic(str(path), b"new\n", b"old\n")
    assert path.read_bytes() == b"new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]
    with pytest.raises(SourceError):
        write_atomic(str(path), b"newer\n", b"old\n")


def test_oversized_file_with_triggers_is_skipped_and_without_is_clean(tmp_path):
    settings = Settings(max_file_size=1000)
    big_legacy = tmp_path / "big.py"
    big_legacy.write_text(LEGACY + "x = 1\n" * 500)
    big_plain = tmp_path / "plain.py"
    big_plain.write_text("x = 1\n" * 500)
    result = run_files([str(big_legacy), str(big_plain)], settings, Job("check"), jobs=1)
    assert [e.path for e in result.all_errors] == [str(big_legacy)]
    assert "exceeds max-file-size" in result.all_errors[0].message


def test_unencodable_fix_output_is_not_written(tmp_path):
    # A latin-1 file whose fix would need a character latin-1 lacks cannot happen with today's
    # rules (they emit ASCII); the guard is exercised through SourceFile directly.
    source = SourceFile.from_bytes("x.py", "# coding: latin-1\nx = 1\n".encode("latin-1"))
    with pytest.raises(UnicodeEncodeError):
        source.encode("x = '\u20ac'\n")
