"""Round-trip sweep: `fix --unsafe-fixes` over copies of the installed `.py` files.

The installed site-packages (torch, and everything else the test environment installs: several
thousand real files; every fourth one in path order within the suite's budget, every one with
AMPMIGRATE_WHOLE_TREES=1) are copied to a temporary directory and fixed through the same calls
`ampmigrate fix --unsafe-fixes` makes (`run_files` + `write_changes`), with every registered
rule enabled. Asserted:

- no crash and no internal error; a file reported as unparsable is one CPython rejects too
  (or one over max-file-size);
- every file that `fix` left alone is byte-identical to its original;
- every changed file was changed by applied fixes, still decodes with its encoding (and keeps
  its BOM), keeps its line-ending style, and parses (libcst, and CPython if it did before);
- a second `fix` changes nothing (idempotence);
- the fix of a changed file's CRLF and BOM variants is the same fix in CRLF / with the BOM.

Installed packages hold little legacy AMP code, so a second sweep plants some: a sample of the
real files (every PROBE_EVERY-th one up to PROBE_MAX_BYTES, stored in turn as UTF-8, CRLF, with
a BOM, and as Latin-1 with a coding cookie) gets a legacy snippet appended whose fix must add `import torch` below the file's own header
(docstrings, licence comments, `__future__` imports, shebangs and coding cookies as they come).
The rest of each file must come through untouched.

The pre-filter makes most files free, so this takes about a minute on two cores. Run it with
`-rP` to see the counts.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import difflib
import io
import os
import re
import shutil
import sysconfig
import time
import tokenize
from pathlib import Path
from typing import Dict, List, Set

import libcst as cst
import pytest

from ampmigrate.config import Settings
from ampmigrate.engine.runner import Job, RunResult, run_files, write_changes
from ampmigrate.rules import rule_classes

from test_prescreen_agreement import TREE_STRIDE

pytestmark = pytest.mark.slow

# Variants (CRLF, BOM) are made of changed files up to this size, to bound the sweep's time.
VARIANT_MAX_BYTES = 256 * 1024
# The probe sample: every PROBE_EVERY-th installed file (in path order) up to PROBE_MAX_BYTES.
PROBE_EVERY = 60
PROBE_MAX_BYTES = 24 * 1024
PROBE_MARKER = "# ampmigrate sweep probe"
PROBE = f"""

{PROBE_MARKER} (données: café)
from torch import cuda as _probe_cuda


def _ampmigrate_probe(model, batch):
    scaler = _probe_cuda.amp.GradScaler()
    with _probe_cuda.amp.autocast():
        return scaler, model(batch)
"""


def _installed_sources() -> Dict[Path, Path]:
    """Every `.py` file of the installed packages: {original path: path relative to the corpus}."""
    roots = []
    for key in ("purelib", "platlib"):
        root = Path(sysconfig.get_paths()[key]).resolve()
        if root.is_dir() and root not in roots:
            roots.append(root)
    sources: Dict[Path, Path] = {}
    for index, root in enumerate(roots):
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = Path(directory, name)
                if name.endswith(".py") and path.is_file():
                    sources[path] = Path(f"root{index}") / path.relative_to(root)
    return sources


def _newline_kinds(data: bytes) -> Set[bytes]:
    kinds = set()
    if b"\r\n" in data:
        kinds.add(b"\r\n")
    if b"\r" in data.replace(b"\r\n", b""):
        kinds.add(b"\r")
    if b"\n" in data.replace(b"\r\n", b""):
        kinds.add(b"\n")
    return kinds


def _cpython_parses(data: bytes) -> bool:
    try:
        ast.parse(data)
    except SyntaxError:
        return False
    except (ValueError, MemoryError, RecursionError):
        return True
    return True


def _encoding(data: bytes) -> str:
    return tokenize.detect_encoding(io.BytesIO(data).readline)[0]


@dataclasses.dataclass
class Sweep:
    corpus: Path
    originals: Dict[Path, Path]  # copy -> original
    result: RunResult
    write_errors: list
    seconds: float

    def copy_bytes(self, copy: Path) -> bytes:
        return copy.read_bytes()

    def original_bytes(self, copy: Path) -> bytes:
        return self.originals[copy].read_bytes()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Sweep:
    every = sorted(_installed_sources().items(), key=lambda item: item[1].as_posix())
    sources = dict(every[::TREE_STRIDE])
    if not any("torch" in relative.parts[1:2] for relative in sources.values()):
        pytest.skip("torch is not installed")
    corpus = tmp_path_factory.mktemp("corpus")
    originals = {}
    for original, relative in sources.items():
        copy = corpus / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(original, copy)
        originals[copy] = original
    files = sorted(str(copy) for copy in originals)
    settings = Settings(unsafe_fixes=True)  # default selection: every registered rule
    start = time.monotonic()
    result = run_files(files, settings, Job("fix", unsafe=True))
    write_errors = write_changes(result)
    seconds = time.monotonic() - start
    return Sweep(corpus, originals, result, write_errors, seconds)


def _sweep_summary(sweep):
    result = sweep.result
    changed = result.changed
    print(
        f"\nround-trip sweep: {result.files} files ({len(rule_classes())} rules), "
        f"{result.parsed} parsed past the pre-filter, {len(changed)} changed, "
        f"{result.fixed} findings fixed, {len(result.all_errors)} not checked, {sweep.seconds:.1f}s"
    )
    for outcome in changed:
        print(f"  changed: {Path(outcome.path).relative_to(sweep.corpus)} ({outcome.fixed} fixed)")
    for error in result.all_errors:
        print(f"  error: {error}")
    assert result.files == len(sweep.originals) > 1000
    assert not sweep.write_errors


def _no_internal_errors_and_only_genuine_parse_errors(sweep):
    for error in sweep.result.all_errors:
        message = error.message
        assert "internal error" not in message and "cannot fix" not in message, str(error)
        if message.startswith("skipped:"):
            # Files over a configured budget are reported and skipped, never half-analysed.
            assert any(key in message for key in ("max-file-size", "file-time-limit", "file-memory-limit")), str(error)
            continue
        data = Path(error.path).read_bytes()
        assert message.startswith(("syntax error", "not valid", "bad encoding", "contains NUL", "not Python source")), str(error)
        if message.startswith(("syntax error", "not Python source")):
            assert not _cpython_parses(data), f"{error}: CPython parses this file"


def _files_not_fixed_are_byte_identical(sweep):
    changed = {outcome.path for outcome in sweep.result.changed}
    for outcome in sweep.result.results:
        if outcome.path in changed:
            assert outcome.fixed > 0, f"{outcome.path} changed without a fix applied"
            continue
        copy = Path(outcome.path)
        assert copy.read_bytes() == sweep.original_bytes(copy), f"{copy} changed though nothing was fixed"


def _changed_files_keep_encoding_line_endings_and_parse(sweep):
    for outcome in sweep.result.changed:
        copy = Path(outcome.path)
        old, new = sweep.original_bytes(copy), copy.read_bytes()
        assert old != new
        encoding = _encoding(old)
        assert _encoding(new) == encoding
        assert new.startswith(codecs.BOM_UTF8) == old.startswith(codecs.BOM_UTF8)
        text = new.decode(encoding)
        assert text == outcome.new_text
        old_kinds = _newline_kinds(old)
        assert _newline_kinds(new) <= (old_kinds or {b"\n"}), f"{copy}: line endings changed"
        cst.parse_module(text)
        if _cpython_parses(old):
            assert _cpython_parses(new), f"{copy}: the fix broke CPython's parse"


@pytest.fixture(scope="module")
def second_round(sweep, tmp_path_factory):
    """Fix the fixed files again, and the CRLF and BOM variants of the smaller originals."""
    variants_dir = tmp_path_factory.mktemp("variants")
    expected: Dict[str, bytes] = {}
    files: List[str] = []
    for index, outcome in enumerate(sweep.result.changed):
        copy = Path(outcome.path)
        files.append(str(copy))
        old, new = sweep.original_bytes(copy), copy.read_bytes()
        if len(old) > VARIANT_MAX_BYTES or _encoding(old) != "utf-8" or b"\r" in old:
            continue
        crlf = variants_dir / f"{index}-crlf.py"
        crlf.write_bytes(old.replace(b"\n", b"\r\n"))
        expected[str(crlf)] = new.replace(b"\n", b"\r\n")
        if not old.startswith(codecs.BOM_UTF8):
            bom = variants_dir / f"{index}-bom.py"
            bom.write_bytes(codecs.BOM_UTF8 + old)
            expected[str(bom)] = codecs.BOM_UTF8 + new
    files.extend(expected)
    result = run_files(files, Settings(unsafe_fixes=True), Job("fix", unsafe=True))
    write_errors = write_changes(result)
    return result, write_errors, expected


def _fixing_again_changes_nothing(sweep, second_round):
    result, write_errors, expected = second_round
    assert not write_errors
    again = {outcome.path: outcome for outcome in result.results if outcome.path not in expected}
    assert len(again) == len(sweep.result.changed)
    for path, outcome in again.items():
        assert not outcome.errors, outcome.errors
        assert outcome.new_text is None, f"{path}: a second fix changed it again (not idempotent)"


def _crlf_and_bom_variants_get_the_same_fix(second_round):
    result, _write_errors, expected = second_round
    by_path = {outcome.path: outcome for outcome in result.results}
    for path, want in expected.items():
        assert not by_path[path].errors, by_path[path].errors
        assert Path(path).read_bytes() == want, f"{path}: the variant was fixed differently"


# ---------------------------------------------------------------------------------- planted code
@dataclasses.dataclass
class Planted:
    text: str  # the planted source, as text
    encoding: str  # as tokenize names it: "utf-8", "utf-8-sig" (with a BOM), "iso-8859-1"
    newline: str


# How the planted copies are stored, in turn: plain, CRLF, with a BOM, Latin-1 with a cookie.
PLANT_STYLES = (("utf-8", "\n"), ("utf-8", "\r\n"), ("utf-8-sig", "\n"), ("iso-8859-1", "\n"))
LATIN1_COOKIE = "# -*- coding: latin-1 -*-\n"


def _plant(data: bytes, style: int):
    """The planted text for a real file in one of PLANT_STYLES, or None where it cannot be."""
    text = data.decode("utf-8")
    encoding, newline = PLANT_STYLES[style % len(PLANT_STYLES)]
    if encoding == "iso-8859-1":
        if not text.isascii() or text.startswith("#!") or b"coding" in b"".join(data.splitlines()[:2]):
            encoding = "utf-8"  # keep the sample going in the plain style
        else:
            text = LATIN1_COOKIE + text
    text = text.replace("\n", newline)
    if text and not text.endswith(newline):
        text += newline
    return Planted(text + PROBE.replace("\n", newline), encoding, newline)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Real files with the legacy snippet appended, fixed once and then fixed again."""
    directory = tmp_path_factory.mktemp("probe")
    planted: Dict[str, Planted] = {}
    candidates = sorted(_installed_sources().items(), key=lambda item: item[1].as_posix())
    for index, (original, relative) in enumerate(candidates):
        if index % PROBE_EVERY or original.stat().st_size > PROBE_MAX_BYTES:
            continue
        data = original.read_bytes()
        if b"\r" in data or data.startswith(codecs.BOM_UTF8) or _encoding(data) != "utf-8" or not _cpython_parses(data):
            continue
        plant = _plant(data, len(planted))
        copy = directory / f"{index}-{relative.name}"
        copy.write_bytes(plant.text.encode(plant.encoding))
        planted[str(copy)] = plant
    # The probe is AMP2 code; other families would (rightly) go on to switch it to bf16, which
    # this pass is not about. The main sweep above runs every rule.
    settings = Settings(unsafe_fixes=True, select=("AMP2",))
    start = time.monotonic()
    first = run_files(sorted(planted), settings, Job("fix", unsafe=True))
    assert not write_changes(first)
    second = run_files(sorted(planted), settings, Job("fix", unsafe=True))
    styles = {style: sum(p.encoding == style[0] and p.newline == style[1] for p in planted.values()) for style in PLANT_STYLES}
    print(
        f"\nplanted sweep: {len(planted)} real files with legacy code appended "
        f"({', '.join(f'{n} {enc} {nl!r}' for (enc, nl), n in styles.items())}), "
        f"{len(first.changed)} fixed, {first.fixed} findings fixed, {time.monotonic() - start:.1f}s (two rounds)"
    )
    return planted, first, second


def _split_at_probe(text: str):
    head, marker, tail = text.partition(PROBE_MARKER)
    assert marker, "the probe was lost"
    return head, tail


def _planted_legacy_code_is_fixed_and_the_rest_kept(probe):
    planted, first, _second = probe
    assert len(planted) > 50
    assert all(sum(p.encoding == enc and p.newline == nl for p in planted.values()) > 5 for enc, nl in PLANT_STYLES)
    refused = 0
    for outcome in first.results:
        assert not outcome.errors, outcome.errors
        plant = planted[outcome.path]
        data = Path(outcome.path).read_bytes()
        if outcome.new_text is None:
            # Only where the fix cannot name torch (a star import may bind it): reported, unfixed.
            refused += 1
            assert [f.code for f in outcome.findings] == ["AMP202", "AMP201"], outcome.path
            assert all("`torch` is taken" in f.no_fix_reason for f in outcome.findings)
            assert data == plant.text.encode(plant.encoding)
            continue
        assert outcome.fixed == 2
        # Same encoding, BOM and line endings; the text is what the engine produced.
        assert _encoding(data) == plant.encoding, outcome.path
        assert data.startswith(codecs.BOM_UTF8) == (plant.encoding == "utf-8-sig")
        new = data.decode(plant.encoding)
        assert new == outcome.new_text
        assert _newline_kinds(data) == {plant.newline.encode()}, outcome.path
        assert _cpython_parses(data), outcome.path
        old_head, old_tail = _split_at_probe(plant.text)
        new_head, new_tail = _split_at_probe(new)
        # The file's own code: only `import torch` (and blank lines around it) may be added.
        old_lines = old_head.splitlines(keepends=True)
        new_lines = new_head.splitlines(keepends=True)
        added = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes():
            assert tag in ("equal", "insert"), f"{outcome.path}: its own code changed: {old_lines[i1:i2]}"
            if tag == "insert":
                added += new_lines[j1:j2]
        assert all(line.strip() in ("", "import torch") for line in added), (outcome.path, added)
        assert sum(line.strip() == "import torch" for line in added) <= 1
        # The planted code: every legacy spelling rewritten, with the device made explicit.
        assert old_tail.startswith(" (données: café)") and new_tail.startswith(" (données: café)")
        assert "_probe_cuda.amp" not in new_tail
        assert re.search(r"""\bamp\.GradScaler\((['"])cuda\1\)""", new_tail), new_tail
        assert re.search(r"""\bamp\.autocast\((['"])cuda\1\)""", new_tail), new_tail
    assert refused < len(planted) / 10


def _planted_fixes_are_idempotent(probe):
    _planted, _first, second = probe
    for outcome in second.results:
        assert not outcome.errors, outcome.errors
        assert outcome.new_text is None, f"{outcome.path}: a second fix changed it again"


# One test per expensive fixture: under `pytest -n` (pytest-xdist's load scheduling) the tests of
# a module may go to different workers, and each would build the module's fixtures again (the
# sweep alone takes about a minute).
def test_sweep_of_the_installed_files(sweep, second_round):
    _sweep_summary(sweep)
    _no_internal_errors_and_only_genuine_parse_errors(sweep)
    _files_not_fixed_are_byte_identical(sweep)
    _changed_files_keep_encoding_line_endings_and_parse(sweep)
    _fixing_again_changes_nothing(sweep, second_round)
    _crlf_and_bom_variants_get_the_same_fix(second_round)


def test_planted_legacy_code(probe):
    _planted_legacy_code_is_fixed_and_the_rest_kept(probe)
    _planted_fixes_are_idempotent(probe)
