"""Bug fixes apart from precision changes: the third program.

A migration by `fix` can repair real GradScaler protocol bugs (AMP3xx: a clip on scaled gradients,
an optimizer step that bypasses the scaler, ...) as well as change the precision. Those repairs
change the training on purpose, so the before and the after are then *expected* to differ, and
the difference says nothing about the precision change. When the migration applies such fixes,
`verify` also runs the before with only those fixes (the "fixed before"), judges the precision
migration between it and the after, and reports the bug fix's own effect (fixed before against the
before) separately.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional

from ampmigrate.config import Settings
from ampmigrate.diagnostics import Finding
from ampmigrate.verify.project import MigratedProject, migrate_copy

PROTOCOL_FAMILY = "AMP3"


@dataclass
class ProtocolFix:
    code: str
    path: str  # relative to the project root
    row: int
    message: str  # what was wrong (the finding)
    change: str  # what the fix did


@dataclass
class BugFixProgram:
    project: MigratedProject  # the before with only the protocol fixes, in its own copy
    fixes: List[ProtocolFix] = field(default_factory=list)


def _known_codes() -> List[str]:
    from ampmigrate.rules import rule_classes

    return [cls.code for cls in rule_classes()]


def protocol_settings(settings: Settings) -> Optional[Settings]:
    """The settings that apply only the protocol rules the migration applies (None: it applies none)."""
    codes = sorted(c for c in settings.enabled_codes(_known_codes()) if c.startswith(PROTOCOL_FAMILY))
    if not codes:
        return None
    return dataclasses.replace(settings, select=tuple(codes), extend_select=(), ignore=())


def bug_fix_program(root: str, destination: str, settings: Settings, ignore: Optional[str] = None) -> Optional[BugFixProgram]:
    """The before with only the protocol fixes the migration applies, or None when there are none.
    `ignore`: a file of the project that is not part of the before (a given --after script)."""
    selected = protocol_settings(settings)
    if selected is None:
        return None
    project = migrate_copy(root, destination, selected)
    skip = _relative(root, ignore) if ignore else None
    if not any(path != skip for path in project.changed):
        return None
    fixes = [fix for fix in _fixed_findings(root, selected, project) if fix.path != skip]
    return BugFixProgram(project, fixes)


def _fixed_findings(root: str, settings: Settings, project: MigratedProject) -> List[ProtocolFix]:
    """The protocol findings of the original that the fixed copy no longer has."""
    from ampmigrate.discovery import discover
    from ampmigrate.engine.runner import Job, run_files

    found = discover([root], settings)
    original = [f for f in run_files(found.files, settings, Job("check")).findings if f.fix is not None]
    left = Counter((_relative(root, f.path), f.code) for f in project.remaining)
    fixes = []
    for finding in original:
        key = (_relative(root, finding.path), finding.code)
        if left[key] > 0:
            left[key] -= 1
            continue
        fixes.append(_describe(root, finding))
    return fixes


def _relative(root: str, path: str) -> str:
    return os.path.relpath(os.path.realpath(path), root)


def _describe(root: str, finding: Finding) -> ProtocolFix:
    return ProtocolFix(
        code=finding.code,
        path=_relative(root, finding.path),
        row=finding.location.row,
        message=finding.message,
        change=finding.fix.message if finding.fix else "",
    )
