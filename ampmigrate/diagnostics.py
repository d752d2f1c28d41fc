"""What the engine reports: findings, their fixes, and per-file errors.

Everything here is plain data that crosses process boundaries (workers pickle it back to the
parent) except `Fix.changes`, the CST-level description of a fix, which only lives in the
process that parsed the file and is dropped on pickling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, FrozenSet, Optional, Tuple

SAFE = "safe"
UNSAFE = "unsafe"


@dataclass(frozen=True, order=True)
class Location:
    """1-based row and 1-based column (in characters), like ruff's JSON output."""

    row: int
    column: int


@dataclass(frozen=True)
class Edit:
    location: Location
    end_location: Location
    content: str


@dataclass(eq=False)
class Fix:
    """A change that resolves one or more findings.

    `changes` are (target node, replacement) pairs against the parsed module; the engine applies
    them with one CST transform. The same Fix object may be attached to several findings (an
    import rewrite and every call site it implies): it is applied once, and only when every one
    of those findings is active and every code in `requires` is selected.
    """

    message: str
    applicability: str
    changes: Tuple[Tuple[Any, Any], ...] = ()
    imports: Tuple[str, ...] = ()
    requires: FrozenSet[str] = frozenset()
    edits: Tuple[Edit, ...] = ()
    # Resolved by another file's fix of the same run, with nothing to change here (a checkpoint
    # helper whose callers pass it a GradScaler in apex's place): `fix` counts it, edits nothing.
    elsewhere: bool = False

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["changes"] = ()
        return state


@dataclass(eq=False)
class Finding:
    code: str
    message: str
    path: str
    location: Location
    end_location: Location
    severity: str = "warning"
    fix: Optional[Fix] = None
    # Why no fix is offered, when a rule knows (shown to the user).
    no_fix_reason: Optional[str] = None
    # Line the finding's noqa comment must sit on (the first line of the node).
    noqa_row: int = 0
    # Source line text, for the `full` output format.
    source_line: str = field(default="", repr=False)
    # Notebooks: the 1-based cell the finding is in; rows and columns (and the fix's edits) are
    # then relative to that cell.
    cell: Optional[int] = None

    @property
    def where(self) -> str:
        """`path`, or `path:cell N` in a notebook: what precedes `:row:col` in output."""
        return self.path if self.cell is None else f"{self.path}:cell {self.cell}"

    def sort_key(self) -> tuple:
        return (self.path, self.cell or 0, self.location.row, self.location.column, self.code)

    @property
    def fails_run(self) -> bool:
        """Informational findings are reported but do not make `check` exit 1."""
        return self.severity != "info"


@dataclass(frozen=True)
class FileError:
    """A file that could not be checked or fixed: one line naming the file and the reason."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
