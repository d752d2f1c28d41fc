"""A per-file result cache, like ruff's: a warm re-run reads and hashes files, nothing more.

Under `<cache dir>/v1/<run key>/`, one pack per output kind (`results.check.json`,
`results.check+edits.json`) maps each file path to a hash of the file's bytes and the file's
result. The run key covers everything else a result depends on: the ampmigrate version, the
source of the ampmigrate package itself (so editing a rule invalidates, even in an editable
install), the rule catalogue, the Python and LibCST versions, and the settings' fingerprint. An
entry is used only when the file's bytes hash to the stored value, so an edited file is
re-checked; a pack or an entry that cannot be read or decoded is treated as missing and rewritten.

One pack, not one file per entry (as ruff keeps one file per package): creating a file costs
far more than writing its bytes (on a virtual disk, about 0.7 ms of system time each: a cold
run over 650 files spent a third of its CPU creating entries). The run's process reads a pack
once, when it first needs it (the workers, forked after, share what it read), keeps what the
run stores in memory (the workers' results come back to it, runner.py), and writes each pack
that changed once, at the end of the run (`flush`), merged with what is on disk then, so that
another run's entries written meanwhile are kept; entries of files that no longer exist go.

Each run marks its run key's directory as used (its modification time) and removes the
directories of other run keys unused for `STALE_AFTER_DAYS` (left by an upgrade or an old
configuration), so the cache does not grow without bound; two configurations in use side by
side (a `check` hook and a `fix` hook with different options) keep theirs.

Packs are JSON (a cache directory can come from anywhere; nothing in it is ever executed) and
are written to a temporary file and renamed into place, so two runs sharing the directory see
either the old or the new pack, never half of one. Failing to write (a read-only directory) is
silent: the run just goes without the cache.

What `fix` may take from the cache: a `check` entry whose findings have no fix that this run
would apply. For such a file, fixing would change nothing and find exactly what `check` found,
so the entry is the answer; `fix` likewise stores what it found in files it left unchanged.
Anything with an applicable fix is fixed afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ampmigrate import __version__
from ampmigrate.config import Settings
from ampmigrate.diagnostics import SAFE, Edit, FileError, Finding, Fix, Location

FORMAT = "v1"
PACK_FORMAT = 1  # the layout of a pack, inside the run key's directory
DEFAULT_DIR_NAME = ".ampmigrate_cache"
STALE_AFTER_DAYS = 30


def default_directory(settings: Settings) -> str:
    """The `cache-dir` setting (relative to the configuration's directory), else
    `.ampmigrate_cache` there. (`--cache-dir` and $AMPMIGRATE_CACHE_DIR come first: cli.py.)"""
    if settings.cache_dir:
        return os.path.join(settings.root, settings.cache_dir)
    return os.path.join(settings.root, DEFAULT_DIR_NAME)


def content_hash(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def code_fingerprint(package: Optional[Path] = None, catalogue: Optional[Path] = None) -> str:
    """A hash of what produces results: the package's own source and the rule catalogue."""
    from ampmigrate.catalogue import catalogue_dir

    package = package or Path(__file__).resolve().parent.parent
    catalogue = catalogue or catalogue_dir()
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for path in sorted(catalogue.glob("*.toml")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _libcst_version() -> str:
    """libcst's installed version: from the name of its `.dist-info` folder beside it, where
    there is one (importing importlib.metadata costs 15-25 ms, on the path of every run),
    else from importlib.metadata."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("libcst")  # finds it without importing it
        if spec is not None and spec.origin:
            site = os.path.dirname(os.path.dirname(spec.origin))
            found = [n for n in os.listdir(site) if n.startswith("libcst-") and n.endswith(".dist-info")]
            if len(found) == 1:
                return found[0][len("libcst-") : -len(".dist-info")]
    except (ImportError, OSError, ValueError):
        pass
    try:
        from importlib.metadata import version

        return version("libcst")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


def run_key(settings: Settings) -> str:
    parts = [
        f"ampmigrate {__version__}",
        f"python {sys.implementation.name} {sys.version}",
        f"libcst {_libcst_version()}",
        f"code {code_fingerprint()}",
        f"settings {settings.fingerprint()}",
    ]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


class Cache:
    """The cache directory of one run. Pickled (for workers that are not forked), it carries
    only its key and directory, not the packs read or the entries stored."""

    def __init__(self, directory: str, key: str) -> None:
        self.directory = directory
        self.key = key
        self.keys = os.path.join(directory, FORMAT)  # one directory per run key
        self.entries = os.path.join(self.keys, key)
        self.writable = True
        self._packs: Dict[str, Dict[str, list]] = {}  # kind -> path -> [content hash, result] as read
        self._read_as: Dict[str, Optional[Tuple[int, int, int]]] = {}  # kind -> the pack file read (`_identity`)
        # kind -> path -> (content hash, findings, errors, parsed): stored, encoded only by `flush`.
        self._stored: Dict[str, Dict[str, Tuple[str, List[Finding], List[FileError], bool]]] = {}

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_packs"], state["_read_as"], state["_stored"] = {}, {}, {}
        return state

    @property
    def index_path(self) -> str:
        """Where the project index keeps its per-module summaries (engine/project_index.py)."""
        return os.path.join(self.entries, "project-index.json")

    def pack_path(self, kind: str) -> str:
        """The pack holding the entries of output `kind`."""
        return os.path.join(self.entries, f"results.{kind}.json")

    @classmethod
    def open(cls, directory: str, settings: Settings) -> "Cache":
        cache = cls(directory, run_key(settings))
        cache.mark_used()
        return cache

    # ------------------------------------------------------------------ housekeeping
    def mark_used(self) -> None:
        """Record that this run key is in use (before the run, so no pruning removes it meanwhile)."""
        try:
            os.utime(self.entries)
        except OSError:
            pass  # not created yet (the first entry creates it), or read-only

    def prune(self, max_age_days: float = STALE_AFTER_DAYS) -> List[str]:
        """Remove the directories of other run keys unused for `max_age_days`; the removed keys."""
        cutoff = time.time() - max_age_days * 86400
        removed = []
        try:
            with os.scandir(self.keys) as scan:
                stale = [e for e in scan if e.name != self.key and e.is_dir(follow_symlinks=False) and e.stat().st_mtime < cutoff]
        except OSError:
            return removed
        for entry in stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
        return removed

    # ------------------------------------------------------------------ entries
    def _read_pack(self, kind: str) -> Tuple[Dict[str, list], Optional[Tuple[int, int, int]]]:
        """The entries of `kind`'s pack on disk ({} when it is missing or not a pack), and which
        file they were read from (`_identity`)."""
        try:
            with open(self.pack_path(kind), "rb") as handle:
                identity = _identity(os.fstat(handle.fileno()))
                data = json.loads(handle.read())
            entries = data["entries"] if data.get("format") == PACK_FORMAT and data.get("kind") == kind else {}
            return (entries if isinstance(entries, dict) else {}), identity
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}, None

    def _pack(self, kind: str) -> Dict[str, list]:
        pack = self._packs.get(kind)
        if pack is None:
            pack, self._read_as[kind] = self._read_pack(kind)
            self._packs[kind] = pack
        return pack

    def has_entry(self, path: str, kind: str) -> bool:
        """Whether some result of `kind` is stored for `path` (for whatever bytes): where none is,
        the file need not even be read to know it is a miss."""
        return path in self._stored.get(kind, ()) or path in self._pack(kind)

    def load(self, path: str, kind: str, digest: str):
        """(findings, errors, parsed) stored for `path` and output `kind`, if stored for these bytes."""
        stored = self._stored.get(kind, {}).get(path)
        if stored is not None:
            return stored[1:] if stored[0] == digest else None
        entry = self._pack(kind).get(path)
        try:
            if entry is None or entry[0] != digest:
                return None
            return decode_result(path, entry[1])
        except (ValueError, KeyError, TypeError, IndexError):
            return None  # corrupt: recomputed and rewritten

    def store(self, path: str, kind: str, digest: str, findings: List[Finding], errors: List[FileError], parsed: bool) -> None:
        """Keep `path`'s result for `flush` to write (encoded then, one entry at a time)."""
        if self.writable:
            self._stored.setdefault(kind, {})[path] = (digest, findings, errors, parsed)

    def flush(self) -> None:
        """Write every pack with entries stored since the last flush: what is on disk now (another
        run may have written meanwhile: the pack this run read is reused only if it is still the
        file there), less the files that no longer exist, plus this run's. The pack is written
        one entry at a time: no second copy of all results is held in memory."""
        stored, self._stored = self._stored, {}
        for kind, entries in stored.items():
            if not entries or not self.writable:
                continue
            base = self._packs.pop(kind, None)
            read_as = self._read_as.pop(kind, None)
            try:
                on_disk = _identity(os.stat(self.pack_path(kind)))
            except OSError:
                on_disk = None
            if base is None or read_as is None or read_as != on_disk:
                base, _ = self._read_pack(kind)
            kept = {path: entry for path, entry in base.items() if path not in entries and os.path.exists(path)}
            del base

            def chunks(kept=kept, entries=entries, kind=kind):
                yield b'{"format":%d,"kind":%s,"entries":{' % (PACK_FORMAT, json.dumps(kind).encode())
                separator = b""
                for path, entry in kept.items():
                    yield separator + json.dumps(path).encode() + b":" + json.dumps(entry, separators=(",", ":")).encode()
                    separator = b","
                for path, (digest, findings, errors, parsed) in entries.items():
                    encoded = [digest, encode_result(findings, errors, parsed)]
                    yield separator + json.dumps(path).encode() + b":" + json.dumps(encoded, separators=(",", ":")).encode()
                    separator = b","
                yield b"}}"

            try:
                self._write(self.pack_path(kind), chunks())
            except OSError:
                self.writable = False  # e.g. a read-only checkout: run on without the cache

    def _write(self, target: str, data: Iterable[bytes]) -> None:
        directory = os.path.dirname(target)
        if not os.path.exists(os.path.join(self.directory, "CACHEDIR.TAG")):
            self._create_directory()  # (the project index may have made the run key's directory)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in data:
                    handle.write(chunk)
            os.replace(tmp, target)  # atomic: readers see the old pack or the new one
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _create_directory(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        ignore = os.path.join(self.directory, ".gitignore")
        if not os.path.exists(ignore):
            with open(ignore, "w", encoding="utf-8") as handle:
                handle.write("# Created by ampmigrate automatically.\n*\n")
        tag = os.path.join(self.directory, "CACHEDIR.TAG")
        if not os.path.exists(tag):
            with open(tag, "w", encoding="utf-8") as handle:
                handle.write("Signature: 8a477f597d28d172789f06886806bc55\n# ampmigrate cache directory.\n")


def _identity(status: os.stat_result) -> Tuple[int, int, int]:
    """Which file a pack is: a pack is replaced (a new inode), never written in place."""
    return status.st_ino, status.st_mtime_ns, status.st_size


# ---------------------------------------------------------------------------------- results <-> JSON
def encode_result(findings: List[Finding], errors: List[FileError], parsed: bool) -> Dict[str, Any]:
    fixes: List[Fix] = []
    index: Dict[int, int] = {}
    encoded = []
    for finding in findings:
        fix_id = None
        if finding.fix is not None:
            fix_id = index.get(id(finding.fix))
            if fix_id is None:  # a fix shared by several findings is stored once
                fix_id = index[id(finding.fix)] = len(fixes)
                fixes.append(finding.fix)
        encoded.append(
            [
                finding.code,
                finding.message,
                [finding.location.row, finding.location.column],
                [finding.end_location.row, finding.end_location.column],
                finding.severity,
                fix_id,
                finding.no_fix_reason,
                finding.noqa_row,
                finding.source_line,
                finding.cell,
            ]
        )
    return {
        "parsed": parsed,
        "errors": [error.message for error in errors],
        "fixes": [
            {
                "message": fix.message,
                "applicability": fix.applicability,
                "imports": list(fix.imports),
                "requires": sorted(fix.requires),
                "edits": [[e.location.row, e.location.column, e.end_location.row, e.end_location.column, e.content] for e in fix.edits],
                "elsewhere": fix.elsewhere,
            }
            for fix in fixes
        ],
        "findings": encoded,
    }


def decode_result(path: str, data: Dict[str, Any]):
    """(findings, errors, parsed) from `encode_result`'s output; raises on malformed data."""
    fixes = [
        Fix(
            message=raw["message"],
            applicability=raw["applicability"],
            imports=tuple(raw["imports"]),
            requires=frozenset(raw["requires"]),
            edits=tuple(Edit(Location(a, b), Location(c, d), content) for a, b, c, d, content in raw["edits"]),
            elsewhere=bool(raw.get("elsewhere", False)),
        )
        for raw in data["fixes"]
    ]
    findings = []
    for code, message, start, end, severity, fix_id, reason, noqa_row, line, cell in data["findings"]:
        findings.append(
            Finding(
                code=code,
                message=message,
                path=path,
                location=Location(*start),
                end_location=Location(*end),
                severity=severity,
                fix=fixes[fix_id] if fix_id is not None else None,
                no_fix_reason=reason,
                noqa_row=noqa_row,
                source_line=line,
                cell=cell,
            )
        )
    errors = [FileError(path, message) for message in data["errors"]]
    return findings, errors, bool(data["parsed"])


def has_fix_to_apply(findings: List[Finding], unsafe: bool) -> bool:
    return any(f.fix is not None and (f.fix.applicability == SAFE or unsafe) for f in findings)
