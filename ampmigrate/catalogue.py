"""The rule catalogue: one TOML file per rule in the top-level `rules/` directory.

The wheel ships the same files as `ampmigrate/_catalogue/` (see pyproject.toml); a source
checkout or an editable install reads `rules/` directly.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FAMILIES = {
    "AMP0": "suppressions",
    "AMP1": "apex",
    "AMP2": "deprecated-api",
    "AMP3": "grad-scaler",
    "AMP4": "precision",
}
FIX_SAFETY = ("safe", "unsafe", "none")
SEVERITIES = ("error", "warning", "info")
DOCS_URL = "https://github.com/ampmigrate/ampmigrate/blob/main/rules/{code}.toml"


@dataclass(frozen=True)
class Example:
    before: str
    after: str
    # Settings the example runs under: `unsafe-fixes`, `target-dtype`, `min-torch`, `select`.
    settings: Tuple[Tuple[str, object], ...] = ()


@dataclass(frozen=True)
class RuleDoc:
    code: str
    name: str
    family: str
    summary: str
    why: str
    fix: str
    severity: str
    examples: Tuple[Example, ...]
    valid: Tuple[str, ...] = ()
    path: Optional[str] = field(default=None, compare=False)

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code)


class CatalogueError(Exception):
    pass


def catalogue_dir() -> Path:
    packaged = Path(__file__).parent / "_catalogue"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "rules"
    if checkout.is_dir():
        return checkout
    raise CatalogueError("rule catalogue not found (neither ampmigrate/_catalogue nor rules/)")


@functools.lru_cache(maxsize=None)
def load_catalogue() -> Dict[str, RuleDoc]:
    docs: Dict[str, RuleDoc] = {}
    for path in sorted(catalogue_dir().glob("*.toml")):
        doc = parse_entry(path)
        docs[doc.code] = doc
    return docs


@functools.lru_cache(maxsize=None)
def rule_doc(code: str) -> RuleDoc:
    """The catalogue entry of one rule, `load_catalogue()[code]`, reading only that rule's file
    when the whole catalogue has not been loaded: a `check` worker asks for the few rules that
    report in its files, not for every entry (parsing all of them cost each worker about 40 ms)."""
    if load_catalogue.cache_info().currsize:
        return load_catalogue()[code]
    path = catalogue_dir() / f"{code}.toml"
    if not code.isalnum() or not path.is_file():
        return load_catalogue()[code]  # an unknown code: the KeyError of the whole catalogue
    return parse_entry(path)


def parse_entry(path: Path) -> RuleDoc:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None

    def need(key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise CatalogueError(f"{path}: missing or empty {key!r}")
        return value

    code = need("code")
    if path.stem != code:
        raise CatalogueError(f"{path}: file name must be the rule code {code!r}")
    family = need("family")
    if family not in FAMILIES or not code.startswith(family):
        raise CatalogueError(f"{path}: family {family!r} does not match code {code!r}")
    fix = need("fix")
    severity = data.get("severity", "warning")
    if fix not in FIX_SAFETY:
        raise CatalogueError(f"{path}: fix must be one of {FIX_SAFETY}")
    if severity not in SEVERITIES:
        raise CatalogueError(f"{path}: severity must be one of {SEVERITIES}")
    examples: List[Example] = []
    for raw in data.get("examples", []):
        if not isinstance(raw.get("before"), str) or not isinstance(raw.get("after"), str):
            raise CatalogueError(f"{path}: every example needs 'before' and 'after' strings")
        settings = tuple(sorted(raw.get("settings", {}).items()))
        examples.append(Example(raw["before"], raw["after"], settings))
    if not examples:
        raise CatalogueError(f"{path}: at least one [[examples]] entry is required")
    valid = tuple(item["code"] for item in data.get("valid", []))
    return RuleDoc(
        code=code,
        name=need("name"),
        family=family,
        summary=need("summary"),
        why=need("why"),
        fix=fix,
        severity=severity,
        examples=tuple(examples),
        valid=valid,
        path=str(path),
    )
