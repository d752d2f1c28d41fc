"""`with autocast(...)` blocks: which statements run inside one, and in which dtype.

An autocast region is a `with` statement one of whose items is an autocast context: a call of any
autocast spelling (`torch.autocast("cuda")`, `torch.amp.autocast(...)`, the deprecated
`torch.cuda.amp.autocast()`), or a name bound to one (`ctx = torch.autocast("cuda")`). Its dtype
and `enabled=` come from `analysis/autocasts.py`. A region whose `enabled=` is the literal `False`
is kept (code inside it deliberately runs outside autocast) but marked disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import libcst as cst

from ampmigrate.analysis.autocasts import autocasts
from ampmigrate.api import ANY_AUTOCAST
from ampmigrate.engine.context import FileContext


@dataclass(eq=False)
class Region:
    statement: cst.With
    item: cst.WithItem
    call: Optional[cst.Call]  # the autocast call (None when the item is a name bound to one)
    enabled: Optional[bool]  # False when `enabled=False` is written literally, else None
    float16: Optional[bool]  # True: float16; False: another dtype (bfloat16); None: not known

    @property
    def only_item(self) -> bool:
        return len(self.statement.items) == 1


def regions(ctx: FileContext) -> Dict[cst.With, Region]:
    return ctx.shared("autocast_regions", lambda: _find(ctx))


def enclosing_region(ctx: FileContext, node: cst.CSTNode, stop: Optional[cst.CSTNode] = None) -> Optional[Region]:
    """The innermost autocast region around `node`, not looking past `stop` (its function)."""
    found = regions(ctx)
    for ancestor in ctx.names.ancestors(node):
        if ancestor is stop or isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
        if isinstance(ancestor, cst.With) and ancestor in found:
            return found[ancestor]
    return None


def _find(ctx: FileContext) -> Dict[cst.With, Region]:
    """Regions from the file's autocasts (analysis/autocasts.py reads their dtype and `enabled`)."""
    # An autocast entered through a parameter may be another context manager on other runs.
    by_call = {a.call: a for a in autocasts(ctx) if a.call is not None and a.parameter is None}
    names = ctx.names
    found: Dict[cst.With, Region] = {}
    for statement in names.nodes_of_type(cst.With):
        for item in statement.items:
            region = _region(ctx, by_call, statement, item)
            if region is not None:
                found[statement] = region
                break
    return found


def _region(ctx: FileContext, by_call, statement: cst.With, item: cst.WithItem) -> Optional[Region]:
    expr = item.item
    names = ctx.names
    if isinstance(expr, cst.Call):
        autocast = by_call.get(expr)
        if autocast is None:
            return None
    elif isinstance(expr, cst.Name) and names.instance_classes(expr) & ANY_AUTOCAST:
        bindings = names.bindings_of(expr)  # ctx = torch.autocast("cuda"); with ctx: ...
        values = [b.value for b in bindings if isinstance(b.value, cst.Call)]
        autocast = by_call.get(values[0]) if len(values) == 1 and len(bindings) == 1 else None
        if autocast is None:
            return Region(statement, item, None, None, None)
    else:
        return None
    dtypes = autocast.dtypes(ctx)
    float16 = None if dtypes is None or ("float16" in dtypes and len(dtypes) > 1) else "float16" in dtypes
    return Region(statement, item, autocast.call, False if autocast.disabled else None, float16)
