"""The two ends of apex's amp module handed on by `from library import *` (engine/apex_star.py).

The provider (`library.py`: `from apex import amp`, unused there) may drop its import only when no
file of the run still needs the name: every file whose star imports reach it and that spells the
name must be one the in-file migration rewrites completely in this run (planned here from the
bytes the index read, so both ends decide alike); a file whose star imports leave the name
unresolved (a later star import of an outside module, ...) but that spells it keeps the import.
The importer's fix says where its `amp` came from, and whether that import stays.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional

from ampmigrate.engine import apex_star
from ampmigrate.engine.context import FileContext
from ampmigrate.rules.apex._other_files import plan_elsewhere, text_as_indexed


def users_problem(ctx: FileContext, names: List[str]) -> Optional[str]:
    """Why the module-level apex amp import binding one of `names` in this file must stay for
    the files that reach it through star imports (None: it may go)."""
    index = ctx.project_index
    if index is None:
        return None
    path = os.path.abspath(ctx.path)
    summary = index.modules.get(path)
    if summary is None or not set(names) & set(summary.apex_star_exports):
        return None
    memo = ctx.shared("apex_star.users", dict)
    key = tuple(sorted(names))
    if key not in memo:
        if path in _ACTIVE:  # planning an importer that is a provider of this one (a cycle)
            return "the files reaching it through `*` imports reach each other"
        _ACTIVE.add(path)
        try:
            memo[key] = _problem(ctx, path, [n for n in names if n in summary.apex_star_exports])
        finally:
            _ACTIVE.discard(path)
    return memo[key]


_ACTIVE: set = set()  # providers whose users are being planned


def _problem(ctx: FileContext, provider: str, names: List[str]) -> Optional[str]:
    index = ctx.project_index
    for other in sorted(index.modules):
        if other == provider or not index.modules[other].star_imports:
            continue
        if provider not in apex_star.reached(index, other):
            continue
        text = text_as_indexed(index, other)
        if text is None:
            return f"{index.relative(other)} reaches it through `*` imports and could not be read again"
        spelled = [n for n in names if re.search(rf"\b{re.escape(n)}\b", text)]
        if not spelled:
            continue
        bound = index.star_bound(other)
        # A name the file binds itself by an apex amp import is apex's module there either way (its
        # in-file migration resolves it so, below); otherwise it must resolve through the chain.
        own = set(index.modules[other].apex_star_exports)
        unresolved = [n for n in spelled if bound.get(n) != apex_star.APEX_AMP and n not in own]
        if unresolved:
            return (
                f"{index.relative(other)} may use `{unresolved[0]}` through its `*` imports (the name is not "
                "resolved there), so the import stays"
            )
        reason = plan_elsewhere(ctx, other, text)
        if reason is not None:
            return f"{index.relative(other)} uses `{spelled[0]}` through `*` imports and is not migrated ({reason})"
    return None


def importer_note(ctx: FileContext, names: Dict[str, str]) -> Optional[str]:
    """The note of an importing file's fix: where its star-bound apex names come from."""
    index = ctx.project_index
    if index is None:
        return None
    amp_names = sorted(n for n, q in names.items() if q == apex_star.APEX_AMP)
    if not amp_names:
        return None
    providers = apex_star.star_providers(index, ctx.path)
    where = ", ".join(index.relative(p) for p in providers) or "a module of the run"
    return (
        f"`{amp_names[0]}` comes from `*` imports of {where}, whose apex import its own fix removes once "
        "every file using it that way migrates"
    )

