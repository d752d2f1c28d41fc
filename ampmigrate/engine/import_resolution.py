"""Which file of the run an import names, the way Python would find it.

`import utils` in a script finds `utils.py` in the script's own directory (`sys.path[0]`); a module
of a package run as `python -m pkg.tool` from a directory finds its absolute imports under that
directory; a module imported by a script finds them where the script does. So the directories an
absolute import of file F may be looked up under (its *roots*) are F's own directory and every
directory above it up to the run's root, and the roots of every file importing F (transitively):
never a sibling folder. Two `utils.py` of two sub-projects of one repository (`MiniViT/Mini-Swin/
utils.py`, `CDARTS/benchmark201/utils/utils.py`) are then never confused.

A file that may edit `sys.path` (or imports one that does, as `tools/_init_paths.py`; or a file
importing it does) can reach other folders: its imports may name every file of the run whose
dotted names end so (the index's loose matching,
`ProjectIndex._by_name`). Relative imports are already absolute from the run's root in the index
(`from . import utils` in `a/b/c.py` is `a.b.utils`), which the root finds.

`candidates(index, importer, dotted)`: the files `import dotted` in `importer` may load (none: a
module outside the run). `importers(index, target)`: every file of the run that may import the file
`target`, and how (names imported from it, the module itself, `*`, or an import that may name it
or another file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterator, List, Set, Tuple

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ProjectIndex


@dataclass
class Importing:
    """How one file may import the module at `target`."""

    names: Set[str] = field(default_factory=set)  # `from target import name`
    module: List[str] = field(default_factory=list)  # `import target` / `from pkg import target`: as spelled
    star: bool = False  # `from target import *` (or a from-line the index cannot split)
    ambiguous: List[str] = field(default_factory=list)  # module or `*` imports that may name target or another file
    # `from m import name` where `m` may be target or another file: {name: m}
    ambiguous_names: Dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.names or self.module or self.star or self.ambiguous or self.ambiguous_names)

    def ambiguity(self, function: str) -> str:
        """The import that may bring `function` of target or something of another file ("" if none)."""
        if self.ambiguous:
            return self.ambiguous[0]
        return self.ambiguous_names.get(function, "")


def _state(index: "ProjectIndex") -> Dict[str, object]:
    return index.__dict__.setdefault("_import_resolution", {"anc": {}, "graph": None, "roots": {}, "loose": {}, "cand": {}})


def _ancestors(index: "ProjectIndex", path: str) -> Tuple[str, ...]:
    memo = _state(index)["anc"]
    found = memo.get(path)
    if found is None:
        root = str(index.root)
        found_list: List[str] = []
        folder = os.path.dirname(path)
        while True:
            found_list.append(folder)
            if folder == root or not folder.startswith(root + os.sep):
                break
            folder = os.path.dirname(folder)
        found = memo[path] = tuple(found_list)
    return found


def _specs(summary) -> Iterator[str]:
    """Every module a file's imports may load: `from m import n` may load `m` and `m.n`."""
    for module, name in summary.from_imports:
        yield module
        yield f"{module}.{name}"
    yield from summary.module_imports
    yield from summary.star_imports


def _under(index: "ProjectIndex", folders, dotted: str) -> List[str]:
    """The files `<folder>/<dotted as a path>.py` and `.../__init__.py` of the run, for each of
    `folders` in order (the module first)."""
    located = _located(index)
    found: List[str] = []
    for folder in folders:
        for candidate in located.get((folder, dotted), ()):
            if candidate not in found:
                found.append(candidate)
    return found


def _located(index: "ProjectIndex") -> Dict[Tuple[str, str], List[str]]:
    """(folder, dotted name) -> the files of the run that name denotes under that folder, the
    module before the package: every dotted name of every file, once (joining paths for each
    folder an import may be looked up under cost 8% of the index's time on Lightning)."""
    state = _state(index)
    located = state.get("located")
    if located is None:
        located = state["located"] = {}
        for path in index.modules:
            package = os.path.basename(path) == "__init__.py"
            base = os.path.dirname(path) if package else path[: -len(".py")] if path.endswith(".py") else None
            if base is None:
                continue
            segments = base.split(os.sep)
            for dotted in index.module_names(path):
                parts = dotted.split(".")
                if segments[len(segments) - len(parts) :] != parts:
                    continue  # not that file's spelling under any folder (cannot happen for a .py file)
                folder = os.sep.join(segments[: len(segments) - len(parts)]) or os.sep  # "/" for "/m.py"
                located.setdefault((folder, dotted), []).append(path)
        for paths in located.values():
            paths.sort(key=lambda p: os.path.basename(p) == "__init__.py")
    return located


def _graph(index: "ProjectIndex") -> Dict[str, Set[str]]:
    """file -> the files importing it, each import looked up under the importer's own folders only."""
    state = _state(index)
    if state["graph"] is None:
        graph: Dict[str, Set[str]] = {}
        edits: Set[str] = set()  # files that edit `sys.path` or import one that does (`_init_paths.py`)
        for path, summary in index.modules.items():
            folders = _ancestors(index, path)
            if summary.edits_sys_path:
                edits.add(path)
            for spec in set(_specs(summary)):
                if not spec or spec.startswith(".") or spec not in index._by_name:
                    continue  # no file of the run ends so (`import torch`): nothing to look for
                for target in _under(index, folders, spec):
                    if target != path:
                        graph.setdefault(target, set()).add(path)
        for path, summary in index.modules.items():
            if summary.edits_sys_path:
                edits.update(graph.get(path, ()))
        state["graph"] = graph
        state["edits"] = edits
    return state["graph"]


def _closure(index: "ProjectIndex", path: str) -> FrozenSet[str]:
    """`path` and every file importing it, transitively."""
    graph = _graph(index)
    seen = {path}
    stack = [path]
    while stack:
        for importer in graph.get(stack.pop(), ()):
            if importer not in seen:
                seen.add(importer)
                stack.append(importer)
    return frozenset(seen)


def roots(index: "ProjectIndex", path: str) -> Tuple[Tuple[str, ...], bool]:
    """(the folders an absolute import of the file at `path` may be looked up under, whether
    `sys.path` may hold others: the file or one importing it may edit it)."""
    state = _state(index)
    memo = state["roots"]
    if path not in memo:
        folders: List[str] = []
        closure = _closure(index, path)
        loose = bool(closure & state["edits"])
        for member in sorted(closure):
            folders.extend(f for f in _ancestors(index, member) if f not in folders)
        memo[path] = (tuple(folders), loose)
    return memo[path]


def candidates(index: "ProjectIndex", importer: str, dotted: str) -> List[str]:
    """The files of the run that `import dotted` in the file `importer` may load, sorted."""
    dotted = dotted.lstrip(".")
    if not dotted:
        return []
    memo = _state(index)["cand"]
    key = (importer, dotted)
    if key not in memo:
        if dotted not in index._by_name:
            memo[key] = []
            return []
        folders, loose = roots(index, importer)
        found = set(_under(index, folders, dotted))
        if loose:
            found.update(index._by_name.get(dotted, ()))
        memo[key] = sorted(found)
    return list(memo[key])


def resolve(index: "ProjectIndex", importer: str, dotted: str):
    """The one file `import dotted` in `importer` loads, or None (none of the run's, or several may)."""
    found = candidates(index, importer, dotted)
    return found[0] if len(found) == 1 else None


def importers(index: "ProjectIndex", target: str) -> Iterator[Tuple[str, Importing]]:
    """(file, how it may import the module at `target`) for each other file of the run that may."""
    names = set(index.module_names(target))

    def hits(importer: str, spec: str) -> Tuple[bool, bool]:
        if spec.lstrip(".") not in names:
            return False, False
        found = candidates(index, importer, spec)
        return target in found, len(found) > 1

    users = _spec_users(index)
    mentioning = set().union(*(users.get(name, ()) for name in names)) if names else set()
    for other in sorted(mentioning):
        summary = index.modules[other]
        if other == target:
            continue
        how = Importing()
        for module, name in summary.from_imports:
            found, several = hits(other, module)
            if found:
                if several:
                    how.ambiguous_names.setdefault(name, module)
                else:
                    how.names.add(name)
            found, several = hits(other, f"{module}.{name}")
            if found:
                (how.ambiguous if several else how.module).append(f"{module}.{name}")
        for spec in summary.module_imports:
            found, several = hits(other, spec)
            if found:
                (how.ambiguous if several else how.module).append(spec)
        for spec in summary.star_imports:
            found, several = hits(other, spec)
            if found:
                if several:
                    how.ambiguous.append(spec)
                else:
                    how.star = True
        if how:
            yield other, how


def _spec_users(index: "ProjectIndex") -> Dict[str, Set[str]]:
    """dotted name -> the files whose imports spell it (leading dots dropped), built once: only
    those can import a given file, so `importers` does not read every file's imports per call
    (that was quadratic in a monorepo)."""
    state = _state(index)
    users = state.get("users")
    if users is None:
        users = {}
        for other, summary in index.modules.items():
            for spec in _specs(summary):
                users.setdefault(spec.lstrip("."), set()).add(other)
        state["users"] = users
    return users


def key(index: "ProjectIndex", paths) -> str:
    """What the resolution of imports into `paths` depends on: the import facts of every file in
    the importers' closures (their folders and `sys.path` edits)."""
    parts = []
    for path in sorted(paths):
        folders, loose = roots(index, path)
        parts.append(repr((path, folders, loose)))
    return "|".join(parts)
