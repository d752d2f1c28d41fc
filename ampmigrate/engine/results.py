"""What checking or fixing one file gives (kept apart from the engine, which imports LibCST: a
run whose files are all cached reads its results without importing LibCST at all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ampmigrate.diagnostics import FileError, Finding

TOO_DEEP = "too deeply nested to analyse (e.g. a chain of hundreds of operators); skipped"


@dataclass
class FileResult:
    path: str
    findings: List[Finding] = field(default_factory=list)
    errors: List[FileError] = field(default_factory=list)
    parsed: bool = False  # False when the pre-filter ruled the file out
    fixed: int = 0  # findings resolved by applied fixes
    fixed_codes: Dict[str, int] = field(default_factory=dict)  # the same, per rule code (--show-fixes)
    new_text: Optional[str] = None  # fix mode: the fixed text, when it differs
    old_text: Optional[str] = None  # fix mode: the original text, when it changed
    # Set by a worker on a result the cache should keep: the key it is stored under (its bytes'
    # hash and dependencies); the run's process stores it (engine/runner.py, engine/cache.py).
    cache_digest: Optional[str] = field(default=None, compare=False, repr=False)
