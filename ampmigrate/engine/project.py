"""What other files of the project import by name from each module.

A fix that changes a module-level binding (`from torch.cuda.amp import autocast` rewritten to
`torch.amp`, whose calls need a device) would break another file that does
`from utils import autocast` and calls it. Single-file analysis cannot see that file, so `fix`
scans the whole project once for `from X import a, b` lines (a regex over bytes, no parsing) and
rules withhold such fixes for names that other modules import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set

from ampmigrate.source import SourceError, read_regular_file

_FROM_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*(?:\\\n[^\n#;]*)*)", re.MULTILINE
)


class ProjectImports:
    def __init__(self, root: str) -> None:
        self.root = Path(os.path.abspath(root))
        self._specs_by_name: Dict[str, Set[str]] = {}

    @classmethod
    def scan(cls, root: str, files: Iterable[str], max_size: Optional[int] = None) -> "ProjectImports":
        """`max_size`: files larger than this are not read (the run reports them as too large)."""
        index = cls(root)
        for path in files:
            try:
                data = read_regular_file(path, max_size)
            except SourceError:  # a pipe, a device, too large, unreadable: `check` reports it
                continue
            if b"import" in data:
                index.add_source(data)
        return index

    def add_source(self, data: bytes) -> None:
        for match in _FROM_IMPORT.finditer(data):
            spec = match.group(1).decode("ascii", "replace").lstrip(".")
            names = match.group(2).decode("utf-8", "replace").strip("()\\ \n\t")
            for part in re.split(r"[,\n\\]", names):
                name = part.split(" as ")[0].strip(" ()\t")
                if name.isidentifier():
                    self._specs_by_name.setdefault(name, set()).add(spec)

    def _module_names(self, path: str) -> Set[str]:
        return set(module_names(self.root, path)) | {""}

    def imported_from(self, path: str) -> FrozenSet[str]:
        """Names other modules import from the module at `path` (`from .x import name` counts)."""
        modules = self._module_names(path)
        return frozenset(
            name
            for name, specs in self._specs_by_name.items()
            if any(spec in modules for spec in specs if spec)
        )


def module_names(root: Path, path: str) -> List[str]:
    """Dotted names a file under `root` can be imported under, longest first: a/b/c.py -> a.b.c, b.c, c."""
    absolute = Path(os.path.abspath(path))
    try:
        parts = list(absolute.relative_to(root).with_suffix("").parts)
    except ValueError:
        parts = [absolute.stem]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    # A folder whose name is no identifier (`.idem_x`, `my.project`, `owner+repo`) cannot be part of
    # a dotted name: the names start below it (a dot in it would split the name wrongly).
    for i in range(len(parts) - 2, -1, -1):
        if not parts[i].isidentifier():
            parts = parts[i + 1 :]
            break
    return [".".join(parts[i:]) for i in range(len(parts))]
