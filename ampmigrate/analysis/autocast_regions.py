"""`with autocast(...)` blocks: which statements run inside one, and in which dtype.

An autocast region is a `with` statement one of whose items is an autocast context: a call of any
autocast spelling (`torch.autocast("cuda")`, `torch.amp.autocast(...)`, the deprecated
`torch.cuda.amp.autocast()`), or a name bound to one (`ctx = torch.autocast("cuda")`). A region
whose `enabled=` is the literal `False` is kept (code inside it deliberately runs outside
autocast) but marked disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import libcst as cst

from ampmigrate.api import ANY_AUTOCAST, BFLOAT16, FLOAT16, LEGACY_API
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import NameIndex


@dataclass(eq=False)
class Region:
    statement: cst.With
    item: cst.WithItem
    call: Optional[cst.Call]  # the autocast call (None when the item is a name bound to one)
    enabled: Optional[bool]  # the literal `enabled=`, if any
    float16: Optional[bool]  # True: float16; False: another dtype (bfloat16); None: not known

    @property
    def only_item(self) -> bool:
        return len(self.statement.items) == 1


def regions(ctx: FileContext) -> Dict[cst.With, Region]:
    return ctx.shared("autocast_regions", lambda: _find(ctx.names))


def enclosing_region(ctx: FileContext, node: cst.CSTNode, stop: Optional[cst.CSTNode] = None) -> Optional[Region]:
    """The innermost autocast region around `node`, not looking past `stop` (its function)."""
    found = regions(ctx)
    for ancestor in ctx.names.ancestors(node):
        if ancestor is stop or isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
        if isinstance(ancestor, cst.With) and ancestor in found:
            return found[ancestor]
    return None


def _find(names: NameIndex) -> Dict[cst.With, Region]:
    found: Dict[cst.With, Region] = {}
    for statement in names.parents:  # every node of the module, in source order
        if not isinstance(statement, cst.With):
            continue
        for item in statement.items:
            region = _region(names, statement, item)
            if region is not None:
                found[statement] = region
                break
    return found


def _region(names: NameIndex, statement: cst.With, item: cst.WithItem) -> Optional[Region]:
    expr = item.item
    call: Optional[cst.Call] = None
    if isinstance(expr, cst.Call) and names.qualified_names(expr.func) & ANY_AUTOCAST:
        call = expr
    elif isinstance(expr, cst.Name) and names.instance_classes(expr) & ANY_AUTOCAST:
        bindings = names.bindings_of(expr)
        values = [b.value for b in bindings if isinstance(b.value, cst.Call)]
        call = values[0] if len(values) == 1 and len(bindings) == 1 else None
    else:
        return None
    if call is None:
        return Region(statement, item, None, None, None)
    return Region(statement, item, call, _enabled(call), _float16(names, call))


def _keyword(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def _enabled(call: cst.Call) -> Optional[bool]:
    value = _keyword(call, "enabled")
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


def _float16(names: NameIndex, call: cst.Call) -> Optional[bool]:
    dtype = _keyword(call, "dtype")
    if dtype is not None:
        qnames = names.qualified_names(dtype)
        if qnames and qnames <= FLOAT16:
            return True
        if qnames and qnames <= BFLOAT16:
            return False
        return None
    # No dtype: the device's default (float16 on cuda, bfloat16 on cpu).
    legacy = [LEGACY_API[q] for q in names.qualified_names(call.func) if q in LEGACY_API]
    if legacy:
        return legacy[0].device == "cuda"
    device = _keyword(call, "device_type")
    if device is None and call.args and call.args[0].keyword is None:
        device = call.args[0].value
    if isinstance(device, cst.SimpleString):
        return {"cuda": True, "cpu": False}.get(device.evaluated_value)
    return None
