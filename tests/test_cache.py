"""The result cache: a warm run is served from it, and nothing stale is ever served.

Each invalidation test proves a recomputation by counting the engine's calls (runs use `-j 1`,
so the engine runs in this process), and proves the answer by the output. No timings here:
speed is measured in bench/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import ampmigrate.engine.cache as cache_module
from ampmigrate.cli import main
from ampmigrate.diagnostics import SAFE, UNSAFE, Edit, FileError, Finding, Fix, Location
from ampmigrate.engine.cache import Cache, code_fingerprint, decode_result, encode_result, has_fix_to_apply
from ampmigrate.engine.pipeline import Engine

from conftest import ROOT

LEGACY = textwrap.dedent(
    """\
    import torch


    def train(model, loader, optimizer):
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            with torch.cuda.amp.autocast():
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """
)
VALUE_USE = textwrap.dedent(
    """\
    import contextlib

    from torch.cuda.amp import autocast


    def context(enabled):
        return autocast if enabled else contextlib.nullcontext
    """
)
CLEAN = "import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    # float16 stays the target (a V100 fleet): train.py's fixes are the safe AMP2 respelling.
    (root / "pyproject.toml").write_text('[tool.ampmigrate]\ntarget-dtype = "float16"\n', encoding="utf-8")
    (root / "src" / "train.py").write_text(LEGACY, encoding="utf-8")
    (root / "src" / "value_use.py").write_text(VALUE_USE, encoding="utf-8")
    (root / "src" / "clean.py").write_text(CLEAN, encoding="utf-8")
    return root


class Spy:
    """Counts the files the engine really analyses (cache misses). Files are analysed in worker
    processes, so each call is noted in a log file they share."""

    def __init__(self, monkeypatch, log: Path) -> None:
        self.log = log
        self.reset()
        check_text, fix_text = Engine.check_text, Engine.fix_text

        def note(kind, path):
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(f"{kind} {os.path.basename(path)}\n")

        def spy_check(engine, text, path, **kwargs):
            note("check", path)
            return check_text(engine, text, path, **kwargs)

        def spy_fix(engine, text, path, **kwargs):
            note("fix", path)
            return fix_text(engine, text, path, **kwargs)

        monkeypatch.setattr(Engine, "check_text", spy_check)
        monkeypatch.setattr(Engine, "fix_text", spy_fix)

    def _calls(self, kind):
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return [line.split(" ", 1)[1] for line in lines if line.split(" ", 1)[0] == kind]

    @property
    def checked(self):
        return self._calls("check")

    @property
    def fixed(self):
        return self._calls("fix")

    def reset(self) -> None:
        self.log.write_text("", encoding="utf-8")


def run(project: Path, *args: str, command: str = "check"):
    extra = ["--output-format", "concise"] if command == "check" and "--output-format" not in args else []
    result = CliRunner().invoke(
        main,
        [command, str(project / "src"), "--config", str(project / "pyproject.toml"), "-j", "1", *extra, *args],
        catch_exceptions=False,
    )
    return result.exit_code, result.output


def packs(directory: Path):
    """The packs of per-file results (not the project index's summaries, engine/project_index.py)."""
    return sorted(p for p in (directory / "v1").rglob("results.*.json") if p.is_file())


def entries(directory: Path):
    """The per-file result entries: (pack, file path) for each."""
    return sorted((pack, path) for pack in packs(directory) for path in json.loads(pack.read_bytes())["entries"])


# ---------------------------------------------------------------------------------- hits
def test_warm_run_is_served_from_the_cache(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    cold = run(project)
    assert cold[0] == 1 and "AMP201" in cold[1] and "AMP202" in cold[1]
    assert sorted(spy.checked) == ["clean.py", "train.py", "value_use.py"]
    spy.reset()
    assert run(project) == cold
    assert spy.checked == []


def test_default_cache_directory_is_beside_the_configuration_and_git_ignored(project):
    run(project)
    directory = project / ".ampmigrate_cache"
    assert (directory / ".gitignore").read_text(encoding="utf-8").splitlines()[-1] == "*"
    assert (directory / "CACHEDIR.TAG").read_text(encoding="utf-8").startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert len(entries(directory)) == 3


def test_cache_dir_option_environment_and_setting(project, tmp_path, monkeypatch):
    run(project, "--cache-dir", str(tmp_path / "by-option"))
    assert len(entries(tmp_path / "by-option")) == 3
    monkeypatch.setenv("AMPMIGRATE_CACHE_DIR", str(tmp_path / "by-env"))
    run(project)
    assert len(entries(tmp_path / "by-env")) == 3
    monkeypatch.delenv("AMPMIGRATE_CACHE_DIR")
    (project / "pyproject.toml").write_text('[tool.ampmigrate]\ncache-dir = "build/lint-cache"\n', encoding="utf-8")
    run(project)
    assert len(entries(project / "build" / "lint-cache")) == 3
    assert not (project / ".ampmigrate_cache").exists()


def test_no_cache_neither_reads_nor_writes(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    spy.reset()
    before = entries(project / ".ampmigrate_cache")
    shutil.rmtree(project / ".ampmigrate_cache")
    run(project, "--no-cache")
    assert not (project / ".ampmigrate_cache").exists()
    assert len(spy.checked) == 3 and len(before) == 3


# ---------------------------------------------------------------------------------- invalidation
def test_editing_a_file_invalidates_its_entry_only(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    spy.reset()
    train = project / "src" / "train.py"
    train.write_text(LEGACY.replace("torch.cuda.amp.GradScaler()", "torch.amp.GradScaler('cuda')"), encoding="utf-8")
    code, output = run(project)
    assert spy.checked == ["train.py"]
    assert "AMP202" not in output and "AMP201" in output
    # Same size, same mtime resolution games do not matter: the key is the bytes.
    spy.reset()
    train.write_text(LEGACY, encoding="utf-8")
    assert "AMP202" in run(project)[1]
    assert spy.checked == ["train.py"]


def test_changing_the_configuration_invalidates(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    spy.reset()
    (project / "pyproject.toml").write_text('[tool.ampmigrate]\nignore = ["AMP202"]\n', encoding="utf-8")
    code, output = run(project)
    assert "AMP202" not in output and "AMP201" in output
    assert len(spy.checked) == 3
    spy.reset()
    code, output = run(project, "--min-torch", "2.2")  # the command line is configuration too
    assert "AMP202" not in output  # torch.amp.GradScaler is 2.3+: not reported for a 2.2 project
    assert len(spy.checked) == 3
    spy.reset()
    run(project, "--min-torch", "2.2")
    assert spy.checked == []


def test_upgrading_ampmigrate_invalidates(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    spy.reset()
    monkeypatch.setattr(cache_module, "__version__", "999.0.0")
    run(project)
    assert len(spy.checked) == 3


def test_run_keys_unused_for_a_month_are_pruned(project, monkeypatch, tmp_path):
    run(project)
    keys = project / ".ampmigrate_cache" / "v1"
    (old_key,) = [d.name for d in keys.iterdir()]
    monkeypatch.setattr(cache_module, "__version__", "999.0.0")  # an upgrade: a new run key
    run(project)
    assert len(list(keys.iterdir())) == 2  # the old key was used today: kept (a second config may use it)
    month_ago = time.time() - (cache_module.STALE_AFTER_DAYS + 1) * 86400
    os.utime(keys / old_key, (month_ago, month_ago))
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    assert spy.checked == []  # the current key's entries still serve this run
    assert old_key not in [d.name for d in keys.iterdir()] and len(list(keys.iterdir())) == 1
    assert len(entries(project / ".ampmigrate_cache")) == 3


def test_a_run_marks_its_key_used_so_it_is_not_pruned(project, monkeypatch):
    run(project)
    keys = project / ".ampmigrate_cache" / "v1"
    (key,) = list(keys.iterdir())
    month_ago = time.time() - (cache_module.STALE_AFTER_DAYS + 1) * 86400
    os.utime(key, (month_ago, month_ago))
    run(project)  # served from the cache, nothing written: the mark is what keeps the key fresh
    assert key.stat().st_mtime > month_ago + 86400
    monkeypatch.setattr(cache_module, "__version__", "999.0.0")
    run(project)
    assert key.exists()


def test_editing_a_rule_or_the_catalogue_invalidates(project, monkeypatch, tmp_path):
    package = tmp_path / "copy" / "ampmigrate"
    catalogue = tmp_path / "copy" / "rules"
    shutil.copytree(ROOT / "ampmigrate", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "rules", catalogue)
    original = code_fingerprint(package, catalogue)
    assert code_fingerprint(package, catalogue) == original
    rule = package / "rules" / "legacy_api" / "amp201_legacy_autocast.py"
    rule.write_text(rule.read_text(encoding="utf-8") + "# a change\n", encoding="utf-8")
    edited_rule = code_fingerprint(package, catalogue)
    assert edited_rule != original
    entry = catalogue / "AMP201.toml"
    entry.write_text(entry.read_text(encoding="utf-8").replace('severity = "warning"', 'severity = "error"'), encoding="utf-8")
    assert code_fingerprint(package, catalogue) not in (original, edited_rule)

    # ... and the run key follows the fingerprint.
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project)
    spy.reset()
    monkeypatch.setattr(cache_module, "code_fingerprint", lambda: "another implementation")
    run(project)
    assert len(spy.checked) == 3


# ---------------------------------------------------------------------------------- robustness
@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00\xff not json",
        b'{"path": "x", "content": "',  # truncated
        b"{}",
        b"[1, 2, 3]",
        b'{"path": null, "content": null, "result": null}',
    ],
)
def test_corrupt_packs_are_ignored_and_rewritten(project, monkeypatch, garbage, tmp_path):
    reference = run(project)
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    for pack in packs(project / ".ampmigrate_cache"):
        pack.write_bytes(garbage)
    assert run(project) == reference
    assert len(spy.checked) == 3
    spy.reset()
    assert run(project) == reference
    assert spy.checked == []


@pytest.mark.parametrize("garbage", [None, [], [1, 2, 3], "x", {}, ["hash", None], ["hash", {"findings": 1}]])
def test_corrupt_entries_are_ignored_and_rewritten(project, monkeypatch, garbage, tmp_path):
    reference = run(project)
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    for pack in packs(project / ".ampmigrate_cache"):
        data = json.loads(pack.read_bytes())
        data["entries"] = {path: garbage for path in data["entries"]}
        pack.write_text(json.dumps(data), encoding="utf-8")
    assert run(project) == reference
    assert len(spy.checked) == 3
    spy.reset()
    assert run(project) == reference
    assert spy.checked == []


def test_entries_with_a_wrong_shape_are_ignored(project, monkeypatch, tmp_path):
    reference = run(project)
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    for pack in packs(project / ".ampmigrate_cache"):
        data = json.loads(pack.read_text(encoding="utf-8"))
        for entry in data["entries"].values():
            entry[1]["findings"] = [["AMP201"]]  # right content hash, malformed result
        pack.write_text(json.dumps(data), encoding="utf-8")
    assert run(project) == reference
    assert len(spy.checked) == 3


def test_one_pack_per_output_kind_written_once_a_run(project, monkeypatch, tmp_path):
    """A cold run creates one file for its results (creating files is what costs), merged with
    another run's entries; entries of files that no longer exist go at the next write."""
    written = []
    original = Cache._write
    monkeypatch.setattr(Cache, "_write", lambda self, target, data: (written.append(target), original(self, target, data))[1])
    run(project)
    assert [Path(t).name for t in written] == ["results.check.json"]
    written.clear()
    run(project)
    assert written == []  # warm: nothing to write
    other = project / "other"
    other.mkdir()
    (other / "more.py").write_text(LEGACY, encoding="utf-8")
    CliRunner().invoke(main, ["check", str(other), "--config", str(project / "pyproject.toml"), "-j", "1"])
    assert len(entries(project / ".ampmigrate_cache")) == 4  # the first run's three are kept
    (project / "src" / "clean.py").unlink()
    (other / "more.py").write_text(CLEAN, encoding="utf-8")
    CliRunner().invoke(main, ["check", str(other), "--config", str(project / "pyproject.toml"), "-j", "1"])
    assert sorted(Path(path).name for _, path in entries(project / ".ampmigrate_cache")) == ["more.py", "train.py", "value_use.py"]


def test_an_unwritable_cache_directory_is_not_an_error(project, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    reference = run(project, "--no-cache")
    assert run(project, "--cache-dir", str(blocker / "cache")) == reference


def test_json_output_has_its_own_entries_with_edits(project, monkeypatch, tmp_path):
    run(project)  # concise output: entries without fix edits
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    code, output = run(project, "--output-format", "json")
    assert len(spy.checked) == 3
    edits = [f["fix"]["edits"] for f in json.loads(output) if f["fix"]]
    assert edits and all(edits)
    spy.reset()
    assert run(project, "--output-format", "json") == (code, output)
    assert spy.checked == []


@pytest.mark.slow  # two CLI processes
def test_two_processes_at_once(project, tmp_path):
    """Concurrent runs sharing a cache directory agree with an uncached run, and leave only
    whole packs (each written to a temporary file and renamed into place)."""
    for i in range(40):
        text = (LEGACY, VALUE_USE, CLEAN)[i % 3]
        (project / "src" / f"module_{i:02d}.py").write_text(text + f"\n# module {i}\n", encoding="utf-8")
    cache_dir = tmp_path / "shared-cache"
    base = [sys.executable, "-m", "ampmigrate", "check", str(project / "src"), "--config", str(project / "pyproject.toml"),
            "--output-format", "concise"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AMPMIGRATE_CACHE_DIR", None)
    reference = subprocess.run([*base, "--no-cache"], capture_output=True, text=True, env=env)
    assert reference.returncode == 1 and "AMP201" in reference.stdout
    for round_ in range(3):  # cold, warm, warm after an edit
        if round_ == 2:
            (project / "src" / "module_00.py").write_text(CLEAN, encoding="utf-8")
            reference = subprocess.run([*base, "--no-cache"], capture_output=True, text=True, env=env)
        procs = [
            subprocess.Popen([*base, "--cache-dir", str(cache_dir), "-j", str(jobs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for jobs in (1, 2)
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert (proc.returncode, out, err) == (reference.returncode, reference.stdout, reference.stderr)
    names = [p.name for p in (cache_dir / "v1").rglob("*") if p.is_file()]
    assert not [n for n in names if n.startswith(".tmp-")]
    for pack in packs(cache_dir):
        assert all(entry[1]["findings"] is not None for entry in json.loads(pack.read_bytes())["entries"].values())


# ---------------------------------------------------------------------------------- fix
def test_fix_is_never_served_a_stale_no_change(project, monkeypatch, tmp_path):
    run(project)  # check fills the cache: train.py has safe fixes
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    code, output = run(project, command="fix")
    assert "Fixed" in output and spy.fixed == ["train.py"]  # value_use.py, clean.py: from the cache
    fixed = (project / "src" / "train.py").read_text(encoding="utf-8")
    assert "torch.amp.autocast(\"cuda\")" in fixed and "torch.cuda.amp" not in fixed
    spy.reset()
    code, output = run(project)
    assert "train.py" not in output and "value_use.py" in output
    assert spy.checked == ["train.py"]  # new bytes: a miss


def test_fix_stores_what_it_found_in_files_it_left_alone(project, monkeypatch, tmp_path):
    spy = Spy(monkeypatch, tmp_path / "spy.log")
    run(project, command="fix")
    assert sorted(spy.fixed) == ["clean.py", "train.py", "value_use.py"]
    spy.reset()
    code, output = run(project)
    # train.py changed (a miss); the other two were stored by `fix` and are hits for `check`.
    assert spy.checked == ["train.py"] and "value_use.py" in output


def test_which_cached_findings_let_fix_skip_a_file():
    def finding(fix):
        return Finding("AMP201", "m", "a.py", Location(1, 1), Location(1, 2), fix=fix)

    safe, unsafe = Fix("s", SAFE), Fix("u", UNSAFE)
    assert not has_fix_to_apply([finding(None)], unsafe=False)
    assert has_fix_to_apply([finding(None), finding(safe)], unsafe=False)
    assert not has_fix_to_apply([finding(unsafe)], unsafe=False)
    assert has_fix_to_apply([finding(unsafe)], unsafe=True)


def test_results_round_trip_through_json():
    shared = Fix("Move it", SAFE, imports=("torch",), requires=frozenset({"AMP201", "AMP202"}),
                 edits=(Edit(Location(1, 1), Location(1, 5), "new"),))
    findings = [
        Finding("AMP201", "first", "a.py", Location(3, 5), Location(3, 9), "warning", shared, None, 3, "line 3"),
        Finding("AMP202", "second", "a.py", Location(4, 1), Location(5, 2), "error", shared, None, 4, "line 4"),
        Finding("AMP206", "third", "a.py", Location(6, 1), Location(6, 2), "info", None, "kept on purpose", 6, "l6"),
    ]
    errors = [FileError("a.py", "internal error in AMP205: boom")]
    data = json.loads(json.dumps(encode_result(findings, errors, True)))
    got, got_errors, parsed = decode_result("a.py", data)
    assert parsed and got_errors == errors
    for a, b in zip(findings, got):
        assert (a.code, a.message, a.path, a.location, a.end_location, a.severity, a.no_fix_reason, a.noqa_row, a.source_line) == (
            b.code, b.message, b.path, b.location, b.end_location, b.severity, b.no_fix_reason, b.noqa_row, b.source_line)
    assert got[0].fix is got[1].fix  # one fix for several findings stays one
    assert (got[0].fix.message, got[0].fix.applicability, got[0].fix.imports, got[0].fix.requires, got[0].fix.edits) == (
        shared.message, shared.applicability, shared.imports, shared.requires, shared.edits)


def test_cache_objects_carry_only_their_key():
    settings_key = Cache.open("/nonexistent", Engine(__import__("conftest").make_settings()).settings).key
    assert len(settings_key) == 32


def test_a_warm_run_reads_each_file_once(project, monkeypatch):
    """The project index hashes every file it reads; the cache lookup takes that hash instead of
    reading and hashing the file a second time."""
    import ampmigrate.engine.runner as runner_module

    reference = run(project)
    reads = []
    original = runner_module.read_regular_file
    monkeypatch.setattr(runner_module, "read_regular_file", lambda path, *a, **k: (reads.append(path), original(path, *a, **k))[1])
    assert run(project) == reference
    assert reads == []


def test_a_pack_written_by_another_run_meanwhile_is_merged_not_lost(tmp_path):
    """A run reuses the pack it read at its start only while that is still the file on disk."""
    files = []
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x = 1\n", encoding="utf-8")
        files.append(str(tmp_path / name))
    first, second = Cache(str(tmp_path / "cache"), "k"), Cache(str(tmp_path / "cache"), "k")
    first.store(files[0], "check", "h0", [], [], False)
    first.flush()
    one, two = Cache(str(tmp_path / "cache"), "k"), Cache(str(tmp_path / "cache"), "k")
    assert one.load(files[0], "check", "h0") == ([], [], False) and two.has_entry(files[0], "check")
    two.store(files[1], "check", "h1", [], [], True)
    two.flush()  # another run, meanwhile
    one.store(files[2], "check", "h2", [], [], False)
    one.flush()
    again = Cache(str(tmp_path / "cache"), "k")
    assert [again.load(f, "check", h) for f, h in zip(files, ("h0", "h1", "h2"))] == [([], [], False), ([], [], True), ([], [], False)]
    assert second.load(files[0], "check", "other bytes") is None


def test_libcst_version_is_the_installed_one():
    """The run key's libcst version, read from its `.dist-info` folder's name (without
    importing importlib.metadata), is what importlib.metadata says."""
    from importlib.metadata import version

    assert cache_module._libcst_version() == version("libcst")
