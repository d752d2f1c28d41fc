"""Settings: defaults, the nearest configuration file, then the command line.

The configuration is, in the nearest directory at or above the start that has one, in order:
`.ampmigrate.toml`, `ampmigrate.toml` (the settings at the top level, like ruff.toml) or a
pyproject.toml with a `[tool.ampmigrate]` table. A file that is not valid TOML is an error
naming the file and line, never silently skipped.

Rule selection follows ruff: `select` entries are code prefixes (`AMP`, `AMP2`, `AMP201`);
a code is enabled when its longest matching `select`/`extend-select` prefix is longer than its
longest matching `ignore` prefix. The command line's `--select` replaces the configured list,
while `--ignore` and `--extend-select` add to it.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, Optional, Sequence, Tuple

from ampmigrate.api import Version, parse_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

TARGET_DTYPES = ("bfloat16", "float16")
DEFAULT_MIN_TORCH: Version = (2, 4)
DEFAULT_MAX_FILE_SIZE = 2 * 1024 * 1024
# What analysing one file may cost (each LibCST parse of it starts the count afresh): CPU
# seconds and MiB of resident memory of the worker process. A file over either is skipped.
DEFAULT_FILE_TIME_LIMIT = 10
DEFAULT_FILE_MEMORY_LIMIT = 2048

# Like ruff's defaults: directories no one wants linted.
DEFAULT_EXCLUDE: Tuple[str, ...] = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints",
    ".mypy_cache", ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache",
    ".svn", ".tox", ".venv", ".vscode", "__pypackages__", "_build", "buck-out", "dist",
    "node_modules", "site-packages", "venv", ".ampmigrate_cache",
)


class ConfigError(Exception):
    """A bad setting: one line, shown to the user, exit status 2."""


@dataclass(frozen=True)
class Settings:
    select: Tuple[str, ...] = ("AMP",)
    extend_select: Tuple[str, ...] = ()
    ignore: Tuple[str, ...] = ()
    target_dtype: str = "bfloat16"
    min_torch: Version = DEFAULT_MIN_TORCH
    exclude: Tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: Tuple[str, ...] = ()
    respect_gitignore: bool = True
    unsafe_fixes: bool = False
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    file_time_limit: int = DEFAULT_FILE_TIME_LIMIT
    file_memory_limit: int = DEFAULT_FILE_MEMORY_LIMIT
    cache_dir: Optional[str] = None
    # (glob, codes): codes switched off in the files a glob matches (relative to `root`, or a name).
    per_file_ignores: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    # The directory the configuration came from (exclude patterns are relative to it).
    root: str = field(default_factory=os.getcwd)
    config_path: Optional[str] = None

    def ignored_in(self, path: str) -> FrozenSet[str]:
        """Code prefixes `per-file-ignores` switches off in `path`."""
        if not self.per_file_ignores:
            return frozenset()
        absolute = os.path.abspath(path)
        relative = os.path.relpath(absolute, self.root).replace(os.sep, "/")
        name = os.path.basename(absolute)
        off = set()
        for pattern, codes in self.per_file_ignores:
            if fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(
                absolute.replace(os.sep, "/"), pattern
            ):
                off.update(codes)
        return frozenset(off)

    def enabled_in(self, code: str, path: str) -> bool:
        """Whether `per-file-ignores` leaves `code` on in `path` (a prefix or ALL switches it off)."""
        return not any(prefix == "ALL" or code.startswith(prefix) for prefix in self.ignored_in(path))

    def enabled_codes(self, known: Iterable[str]) -> FrozenSet[str]:
        return frozenset(
            code
            for code in known
            if _longest_prefix(code, self.select + self.extend_select)
            > _longest_prefix(code, self.ignore)
        )

    def fingerprint(self) -> str:
        """Everything in the settings that a file's result can depend on (part of the cache key).

        Every field except those that only choose which files are looked at or where the cache
        lives, so that a setting added later is covered without anyone remembering to add it.
        """
        return repr([(f.name, getattr(self, f.name)) for f in fields(self) if f.name not in _NOT_IN_FINGERPRINT])


# Settings that decide which files a run looks at, or where the cache is, not what a file yields.
# (A file over its time or memory budget has no cache entry: the budgets are not in it either.)
_NOT_IN_FINGERPRINT = frozenset(
    {"exclude", "extend_exclude", "respect_gitignore", "cache_dir", "root", "config_path", "file_time_limit", "file_memory_limit"}
)


def _longest_prefix(code: str, prefixes: Sequence[str]) -> int:
    best = 0
    for prefix in prefixes:
        if prefix == "ALL":
            best = max(best, 1)
        elif code.startswith(prefix):
            best = max(best, len(prefix) + 1)
    return best


def validate_codes(entries: Iterable[str], known: Iterable[str], origin: str) -> None:
    known = list(known)
    for entry in entries:
        if entry == "ALL":
            continue
        if not any(code.startswith(entry) for code in known):
            raise ConfigError(f"{origin}: unknown rule code or prefix {entry!r}")


def split_codes(values: Iterable[str]) -> Tuple[str, ...]:
    """`--select AMP2,AMP301 --select AMP4` -> ('AMP2', 'AMP301', 'AMP4')."""
    codes = []
    for value in values:
        codes.extend(part.strip().upper() for part in value.split(",") if part.strip())
    return tuple(codes)


# ------------------------------------------------------------------------------ pyproject
_KEYS = {
    "select": "codes",
    "extend-select": "codes",
    "ignore": "codes",
    "target-dtype": "dtype",
    "min-torch": "version",
    "exclude": "strings",
    "extend-exclude": "strings",
    "respect-gitignore": "bool",
    "unsafe-fixes": "bool",
    "max-file-size": "int",
    "file-time-limit": "int",
    "file-memory-limit": "int",
    "cache-dir": "string",
    "per-file-ignores": "per-file",
}
STANDALONE_CONFIGS = (".ampmigrate.toml", "ampmigrate.toml")


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends "(at line L, column C)": the file and line in one line.
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _is_standalone(path: Path) -> bool:
    return path.name in STANDALONE_CONFIGS


def find_config(start: str) -> Optional[Path]:
    """The nearest configuration at or above `start` (see the module docstring)."""
    current = Path(start).resolve()
    for directory in (current, *current.parents):
        for name in STANDALONE_CONFIGS:
            if (directory / name).is_file():
                return directory / name
        candidate = directory / "pyproject.toml"
        if candidate.is_file() and "ampmigrate" in _read_toml(candidate).get("tool", {}):
            return candidate
    return None


def load_settings(config: Optional[str] = None, start: Optional[str] = None) -> Settings:
    """Defaults updated from `config` (or the nearest configuration found from `start`)."""
    path = Path(config) if config else find_config(start or os.getcwd())
    if path is None:
        return Settings()
    data = _read_toml(path)
    where = "" if _is_standalone(path) else " in [tool.ampmigrate]"
    table = data if _is_standalone(path) else data.get("tool", {}).get("ampmigrate", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.ampmigrate] must be a table")
    values: Dict[str, object] = {}
    for key, raw in table.items():
        kind = _KEYS.get(key)
        if kind is None:
            raise ConfigError(f"{path}: unknown key {key!r}{where} (known: {', '.join(sorted(_KEYS))})")
        values[key.replace("-", "_")] = _convert(path, key, kind, raw)
    return replace(Settings(), root=str(path.parent.resolve()), config_path=str(path), **values)


def _convert(path: Path, key: str, kind: str, raw: object) -> object:
    where = f"{path}: {key}" if _is_standalone(path) else f"{path}: [tool.ampmigrate] {key}"
    if kind == "per-file":
        if not isinstance(raw, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in raw.values()
        ):
            raise ConfigError(f"{where} must be a table of glob = [codes]")
        return tuple((glob, tuple(x.upper() for x in codes)) for glob, codes in raw.items())
    if kind in ("codes", "strings"):
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(x.upper() for x in raw) if kind == "codes" else tuple(raw)
    if kind == "bool":
        if not isinstance(raw, bool):
            raise ConfigError(f"{where} must be true or false")
        return raw
    if kind == "int":
        if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
            raise ConfigError(f"{where} must be a positive integer")
        return raw
    if kind == "string":
        if not isinstance(raw, str):
            raise ConfigError(f"{where} must be a string")
        return raw
    if kind == "dtype":
        return check_target_dtype(raw, where)
    if kind == "version":
        try:
            return parse_version(str(raw))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    raise AssertionError(kind)


def check_target_dtype(value: object, where: str) -> str:
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    text = aliases.get(str(value).lower(), str(value).lower())
    if text not in TARGET_DTYPES:
        raise ConfigError(f"{where}: target dtype must be one of {', '.join(TARGET_DTYPES)}, got {value!r}")
    return text


def resolve_settings(
    select: Sequence[str] = (),
    extend_select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    target_dtype: Optional[str] = None,
    min_torch: Optional[str] = None,
    config_path: Optional[str] = None,
    unsafe_fixes: Optional[bool] = None,
    start: Optional[str] = None,
) -> Settings:
    """Settings from the configuration (the nearest to `start`, default the working directory)
    and the command-line options (`--select` replaces the configured list; `--ignore` and
    `--extend-select` add to it). Shared by every command: check, fix, verify, server."""
    from ampmigrate.rules import rule_codes

    settings = load_settings(config_path, start=start)
    known = rule_codes()  # the codes of rule_classes(), without importing them
    origin = settings.config_path or "configuration"
    configured = settings.select + settings.extend_select + settings.ignore
    validate_codes(configured + tuple(c for _, codes in settings.per_file_ignores for c in codes), known, origin)
    changes: Dict[str, object] = {}
    if select:
        changes["select"] = split_codes(select)
    if extend_select:
        changes["extend_select"] = settings.extend_select + split_codes(extend_select)
    if ignore:
        changes["ignore"] = settings.ignore + split_codes(ignore)
    for key in ("select", "extend_select", "ignore"):
        if key in changes:
            validate_codes(changes[key], known, f"--{key.replace('_', '-')}")  # type: ignore[arg-type]
    if target_dtype:
        changes["target_dtype"] = check_target_dtype(target_dtype, "--target-dtype")
    if min_torch:
        try:
            changes["min_torch"] = parse_version(min_torch)
        except ValueError as exc:
            raise ConfigError(f"--min-torch: {exc}") from None
    if unsafe_fixes:
        changes["unsafe_fixes"] = True
    return replace(settings, **changes)
