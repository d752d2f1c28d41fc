"""AMP111: an import of apex.amp, apex.fp16_utils or apex.parallel, which apex removed in May 2025.

On a current apex the import line itself raises ImportError, before any use runs, so it is the
finding even where no use can be followed (the module passed on as a value, re-exported, reached
through `*`). Its fix is the one the uses' rules (AMP101-AMP109) already make that removes or
rewrites this import: the same change, attached here too, so it is applied once. `import apex`
(and `import apex.amp`, which binds `apex`) counts only where the file reaches a removed package
through it (`apex.amp.initialize`); used for
apex.optimizers or apex.contrib it is still a working import (AMP110 marks what has no torch
counterpart). An import already reported as unused by the rule of what it imports is not
reported twice.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

import libcst as cst

from ampmigrate.api import APEX_FP16_UTILS, APEX_REMOVED, APEX_REMOVED_MODULES
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.names import dotted
from ampmigrate.rules.apex._amp_migration import amp_plan
from ampmigrate.rules.apex._class_migration import class_groups
from ampmigrate.rules.apex._import_lines import covering, fix_for
from ampmigrate.rules.base import Rule

CODE = "AMP111"


def _removed(qname: str) -> Optional[str]:
    """The removed apex package `qname` is in or under (or the removed name itself: the old
    `apex.optimizers.FP16_Optimizer`)."""
    for module in APEX_REMOVED_MODULES:
        if qname == module or qname.startswith(module + "."):
            return module
    return qname if qname in APEX_FP16_UTILS else None


class ApexRemovedImport(Rule):
    code = CODE
    triggers = (r"\bapex\b",)  # the import statement spells apex
    qualified_prefixes = (*APEX_REMOVED_MODULES, *(q for q in APEX_FP16_UTILS if q.startswith("apex.optimizers.")))

    def check(self, ctx) -> None:
        statements = list(_removed_imports(ctx))
        if not statements:
            return
        groups = _use_groups(ctx)
        reported = covering(ctx, (site for sites, _, _ in groups for site in sites))
        for statement, modules in statements:
            if id(statement) in reported:
                continue  # already a finding of the rule of what it imports (an unused import)
            fix = fix_for(ctx, (fix for _, fix, _ in groups), statement)
            reason = None if fix is not None else _reason(ctx, statement, groups)
            message = _message(statement, modules)
            ctx.report(statement, message, fix=fix, no_fix_reason=reason)


def _message(statement: cst.CSTNode, modules: List[str]) -> str:
    spelled = ", ".join(f"`{m}`" for m in modules)
    when = " and ".join(dict.fromkeys(APEX_REMOVED.get(m, APEX_REMOVED["apex.fp16_utils"]) for m in modules))
    removed = f"{spelled} {'were' if len(modules) > 1 else 'was'} removed from apex in {when}"
    if isinstance(statement, cst.Import) and not any(_removed(dotted(a.name) or "") for a in statement.names):
        # `import apex` itself still works; what the file reaches through it does not.
        return f"`apex` is imported here for {spelled}, which apex removed in {when}; migrate those uses"
    return f"{removed}, so this import fails on a current apex; migrate its uses to torch.amp / torch.nn and remove it"


def _removed_imports(ctx) -> Iterator[Tuple[cst.CSTNode, List[str]]]:
    """Import statements that load a removed apex package, with that package."""
    names = ctx.names
    for statement in names.nodes_of_type((cst.Import, cst.ImportFrom)):
        modules: List[str] = []
        if isinstance(statement, cst.ImportFrom):
            if statement.relative or statement.module is None:
                continue
            base = dotted(statement.module) or ""
            if isinstance(statement.names, cst.ImportStar):
                modules.append(base)
            else:
                modules.extend(f"{base}.{dotted(alias.name)}" for alias in statement.names)
        else:
            for alias in statement.names:
                imported = dotted(alias.name) or ""
                if alias.asname is None and imported.startswith("apex"):
                    # `import apex` / `import apex.amp` bind `apex`: count what is reached through it.
                    modules.extend(_removed_uses_through(ctx, statement, alias))
                else:
                    modules.append(imported)
        found = sorted({m for m in map(_removed, modules) if m is not None})
        if found:
            yield statement, found


def _removed_uses_through(ctx, statement: cst.Import, alias: cst.ImportAlias) -> List[str]:
    """`import apex` then `apex.amp.X` / `apex.parallel.Y`: the removed packages it reaches."""
    names = ctx.names
    found: List[str] = []
    for binding in names.scope_of(statement).bindings.get("apex", []):
        if binding.node is not alias:
            continue
        for ref in names.references(binding):
            parent = names.parent(ref)
            if isinstance(parent, cst.Attribute) and parent.value is ref:
                qname = f"apex.{parent.attr.value}"
                if _removed(qname):
                    found.append(qname)
    return found


def _use_groups(ctx) -> List[Tuple[Sequence[cst.CSTNode], Optional[Fix], Optional[str]]]:
    """(reported nodes, fix, reason) of every apex rule that reports uses of a removed package."""
    from ampmigrate.rules.apex.amp106_apex_fp16_utils import MAPPINGS as FP16_UTILS
    from ampmigrate.rules.apex.amp109_apex_parallel import MAPPINGS as PARALLEL

    groups: List[Tuple[Sequence[cst.CSTNode], Optional[Fix], Optional[str]]] = []
    plan = amp_plan(ctx.file)
    groups.append(([site.node for site in plan.sites], plan.fix, plan.reason))
    for mappings, key in ((FP16_UTILS, "fp16_utils"), (PARALLEL, "parallel")):
        for group in class_groups(ctx.file, mappings, key):
            groups.append(([site.node for site in group.sites], group.fix, group.reason))
    return groups


def _reason(ctx, statement: cst.CSTNode, groups) -> str:
    if isinstance(statement, cst.ImportFrom) and isinstance(statement.names, cst.ImportStar):
        return "the names it brings in through `*` cannot be rewritten; import them by name, or migrate by hand"
    bound = _bound_names(ctx, statement)
    for binding in ctx.names.scope_of(statement).bindings.values():
        for b in binding:
            if b.statement is statement and ctx.reexported(b):
                return (
                    f"`{b.name}` is re-exported from here (`__all__` or a package `__init__`); the modules that "
                    "import it must be migrated first, then the import can go"
                )
    related = [
        (sites, fix, reason)
        for sites, fix, reason in groups
        if any(_root(site) in bound for site in sites)
    ]
    for _, fix, reason in related:
        if fix is None and reason:
            return f"its uses cannot be migrated automatically: {reason}"
    if related:
        return "it goes with the fix of its last use"
    return (
        "no use of it here that a fix can follow (passed on as a value, or re-exported); "
        "migrate the uses by hand and remove the import"
    )


def _bound_names(ctx, statement: cst.CSTNode) -> set:
    found = set()
    if isinstance(statement.names, cst.ImportStar):
        return found
    for alias in statement.names:
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            found.add(alias.asname.name.value)
        else:
            found.add((dotted(alias.name) or "").split(".")[0])
    return found


def _root(node: cst.CSTNode) -> Optional[str]:
    while isinstance(node, (cst.Attribute, cst.Call)):
        node = node.value if isinstance(node, cst.Attribute) else node.func
    return node.value if isinstance(node, cst.Name) else None
