"""The "after" side: the script's project, migrated in a temporary copy.

Real training code is rarely one file, so the whole project root is copied: every Python file
is copied (migrated with the fixes `fix` would apply under the loaded settings, where `fix`
would look at it), everything else is linked, and folders without Python files are linked
whole, so data and config files read relative to `__file__` are found. Folders nobody wants
(`.git`, virtual environments, caches) are left out. The user's files are only read.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Set

from ampmigrate.config import DEFAULT_EXCLUDE, Settings
from ampmigrate.diagnostics import FileError, Finding
from ampmigrate.discovery import SOURCE_SUFFIXES, discover
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.runner import Job, run_files
from ampmigrate.source import SourceError, SourceFile

_SKIPPED_DIRS = frozenset(DEFAULT_EXCLUDE) | {"__pycache__"}


def skipped_dir(name: str) -> bool:
    """Folders nobody wants in a copy nor looks into (`.git`, virtual environments, caches)."""
    return name in _SKIPPED_DIRS


@dataclass
class MigratedProject:
    root: str  # the user's project root (resolved)
    copy: str  # its migrated copy
    changed: Dict[str, int] = field(default_factory=dict)  # relative path -> findings fixed
    remaining: List[Finding] = field(default_factory=list)  # findings the migration left
    errors: List[FileError] = field(default_factory=list)

    def in_copy(self, path: str) -> str:
        """Where a file of the project (given by any path that resolves under the root) lies in the copy."""
        return os.path.join(self.copy, os.path.relpath(os.path.realpath(path), self.root))

    @property
    def fixed(self) -> int:
        return sum(self.changed.values())


def migrate_copy(root: str, destination: str, settings: Settings) -> MigratedProject:
    """Copy `root` to `destination` (which must not exist) and migrate the copy's Python files."""
    root = os.path.realpath(root)
    project = MigratedProject(root=root, copy=os.path.abspath(destination))
    _copy_tree(root, project.copy)
    found = discover([root], settings)
    project.errors.extend(found.errors)
    index = ProjectIndex.build(root, found.files, max_size=settings.max_file_size)  # as `fix` does
    result = run_files(found.files, settings, Job("fix", unsafe=settings.unsafe_fixes), index=index)
    project.errors.extend(result.all_errors)
    project.remaining = result.findings
    for outcome in result.changed:
        relative = os.path.relpath(os.path.abspath(outcome.path), root)
        target = os.path.join(project.copy, relative)
        if not _inside(os.path.realpath(os.path.dirname(target)), project.copy):
            # Reached through a linked folder: writing would write into the user's files.
            project.errors.append(FileError(outcome.path, "in a symlinked folder; not migrated in the copy"))
            continue
        try:
            source = SourceFile.read(outcome.path)
            data = source.encode(outcome.new_text)
        except (SourceError, UnicodeEncodeError) as exc:
            project.errors.append(FileError(outcome.path, f"not migrated in the copy: {exc}"))
            continue
        if os.path.islink(target):
            os.unlink(target)  # a linked file: the copy gets its own migrated text
        with open(target, "wb") as handle:
            handle.write(data)
        project.changed[relative] = outcome.fixed
    return project


def _copy_tree(root: str, destination: str) -> None:
    with_python = _folders_with_python(root)
    os.makedirs(destination)
    for directory, subdirectories, files in os.walk(root):
        relative = os.path.relpath(directory, root)
        target_dir = os.path.normpath(os.path.join(destination, relative))
        kept = []
        for name in sorted(subdirectories):
            source = os.path.join(directory, name)
            if name in _SKIPPED_DIRS:
                continue
            if os.path.islink(source) or source not in with_python:
                os.symlink(os.path.realpath(source), os.path.join(target_dir, name), target_is_directory=True)
            else:
                os.mkdir(os.path.join(target_dir, name))
                kept.append(name)
        subdirectories[:] = kept
        for name in files:
            source = os.path.join(directory, name)
            target = os.path.join(target_dir, name)
            if name.endswith(SOURCE_SUFFIXES) and not os.path.islink(source):
                shutil.copy2(source, target)
            else:
                os.symlink(os.path.realpath(source), target)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _folders_with_python(root: str) -> Set[str]:
    """Folders (below `root`) that hold a Python file somewhere under them."""
    found: Set[str] = set()
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _SKIPPED_DIRS and not os.path.islink(os.path.join(directory, d))]
        if any(name.endswith(SOURCE_SUFFIXES) for name in files):
            path = Path(directory)
            while True:
                found.add(str(path))
                if str(path) == root or path.parent == path:
                    break
                path = path.parent
    return found
