"""A function that gains a `scaler` parameter must not be called from another file.

The fix passes the GradScaler to the module-level functions between `amp.initialize` and the
scaled backward as a new parameter (rules/apex/_scaler_access.py), and every call in this file
passes it. A call in another file of the run (`from train import train_step`, then
`train_step(model, optimizer, x)`) would not: after the migration it raises `TypeError`, or, where
the parameter is optional, scales with no scaler. The project index says which files may import
this one (engine/import_resolution.py) and how each uses the function (engine/caller_uses.py);
any use there refuses the migration with the file and line. A run of one file has no index: its
importers are unknown, as they were to the fix before.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Optional

from ampmigrate.engine.caller_uses import uses
from ampmigrate.rules.apex._amp_common import Unfixable

if TYPE_CHECKING:
    from ampmigrate.engine.names import Scope
    from ampmigrate.rules.apex._amp_migration import _Planner


def check_threaded_importers(planner: "_Planner", functions: Iterable["Scope"]) -> None:
    index = planner.ctx.project_index
    if index is None:
        return
    path = os.path.abspath(planner.ctx.path)
    names = [
        scope.node.name.value for scope in functions
        if scope.parent is planner.names.module_scope and hasattr(scope.node, "name")
    ]
    if not names:
        return
    for other in index.importers_of(path):
        if other == path:
            continue
        for name in names:
            problem = _use_problem(index, other, path, name)
            if problem:
                raise Unfixable(
                    f"`{name}()` takes the GradScaler as a new parameter, and {index.relative(other)} {problem}: "
                    "migrate that file's use of it too"
                )


def _use_problem(index, other: str, path: str, name: str) -> Optional[str]:
    found = uses(index, other, path, name)
    if found is None:
        return "could not be read again to see whether it calls it"
    if found.calls:
        return f"calls it at line {found.calls[0].line} without one"
    if found.other or found.escapes or found.rebound or found.shadowed:
        return "uses it otherwise than by calling it"
    return None
