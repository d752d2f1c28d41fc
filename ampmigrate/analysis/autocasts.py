"""Every autocast of a file, with its device and the dtype it runs in.

An autocast's dtype is its `dtype` argument (by keyword, or second positionally in both the
modern `(device_type, dtype, ...)` and the legacy `(enabled, dtype, ...)` signatures), followed
to where it is written (see `values.py`): a literal, a ternary, a variable, a `{"fp16":
torch.float16, ...}[name]` lookup or `getattr(torch, name)` on a string that is itself followed
to a literal or an argparse default. Without a dtype argument it is the device's default
(float16 on CUDA), unless the file changes that default with `torch.set_autocast_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.values import (
    UNKNOWN,
    Followed,
    Follower,
    Source,
    is_comparison_use,
    literal_value,
    respell_string,
)
from ampmigrate.api import (
    ANY_AUTOCAST,
    AUTOCAST_DEFAULT_DTYPE,
    DTYPE_ATTRIBUTES,
    LEGACY_API,
    SET_AUTOCAST_DTYPE,
    TORCH_DTYPES,
    LegacyApi,
)
from ampmigrate.engine.context import FileContext

BF16_DTYPE = "bfloat16"  # Source.bf16 for a source written as a dtype: spell `torch.bfloat16` there


@dataclass(eq=False)
class Autocast:
    ref: cst.BaseExpression  # the callee
    call: Optional[cst.Call]  # None when the autocast is used some other way than a call
    legacy: Optional[LegacyApi]
    devices: Optional[FrozenSet[str]]  # the device types it can run on; None when unknown
    dtype_arg: Optional[cst.Arg]
    dtype: Optional[Followed]  # the followed dtype argument; None when there is none
    disabled: bool  # `enabled=False` written literally
    opaque: bool  # passed around or called with */** arguments: its dtype cannot be read
    # The parameter an alias of the class was passed in as (`train_one_epoch(amp_autocast=ac)`,
    # then `with amp_autocast():`); that parameter may hold another context manager in other runs.
    parameter: Optional[str] = None

    def dtypes(self, ctx: FileContext) -> Optional[FrozenSet[str]]:
        """The dtypes it can run in, or None when that is not known."""
        if self.opaque:
            return None
        if self.dtype is not None:
            if not self.dtype.complete:
                return None
            values = self.dtype.values()
            return frozenset(values) if all(isinstance(v, str) for v in values) else None
        if self.devices is None or autocast_dtype_is_changed(ctx):
            return None
        defaults = {AUTOCAST_DEFAULT_DTYPE.get(device) for device in self.devices}
        return None if None in defaults else frozenset(defaults)


def autocasts(ctx: FileContext) -> List[Autocast]:
    return ctx.shared("autocasts", lambda: _collect(ctx))


def autocast_dtype_is_changed(ctx: FileContext) -> bool:
    return ctx.shared("autocasts.default_changed", lambda: bool(ctx.names.find(SET_AUTOCAST_DTYPE)))


def _collect(ctx: FileContext) -> List[Autocast]:
    names = ctx.names
    found: List[Autocast] = []
    for ref, qnames in names.find(ANY_AUTOCAST):
        legacy_names = [LEGACY_API[q] for q in qnames if q in LEGACY_API]
        if len(legacy_names) not in (0, len(qnames)):
            legacy = None
            mixed = True  # modern in one branch, legacy in another: positions differ
        else:
            legacy = legacy_names[0] if legacy_names else None
            mixed = len({(l.device) for l in legacy_names}) > 1
        parent = names.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            found.append(_analyse_call(ctx, ref, parent, legacy, opaque=mixed))
        elif not _is_alias_definition(ctx, ref):
            found.append(Autocast(ref, None, legacy, None, None, None, False, True))
        elif legacy is not None and legacy.kind == "autocast" and not mixed:
            found.extend(_entered_through_parameters(ctx, ref, legacy))
    return found


def _entered_through_parameters(ctx: FileContext, ref: cst.BaseExpression, legacy: LegacyApi) -> List[Autocast]:
    """`ac = torch.cuda.amp.autocast` handed to a function of this file (`train_one_epoch(...,
    amp_autocast=ac)`, timm's trainers): the calls of that parameter in the function are autocasts
    of the class (on the runs that pass it). Only where every use of the parameter there is a call."""
    names = ctx.names
    statement = names.parent(ref)
    while isinstance(statement, cst.IfExp):
        statement = names.parent(statement)
    target = statement.targets[0].target if isinstance(statement, cst.Assign) else getattr(statement, "target", None)
    if not isinstance(target, cst.Name):
        return []
    binding = next((b for b in names.scope_of(target).bindings.get(target.value, []) if b.node is target), None)
    if binding is None:
        return []
    found: List[Autocast] = []
    for use in names.references(binding):
        arg = names.parent(use)
        call = names.parent(arg)
        if not (isinstance(arg, cst.Arg) and arg.value is use and not arg.star and isinstance(call, cst.Call)):
            continue
        parameter = _parameter_receiving(ctx, call, arg)
        if parameter is None:
            continue
        uses = names.references(parameter)
        calls = [names.parent(u) for u in uses]
        if not uses or not all(isinstance(c, cst.Call) and c.func is u for c, u in zip(calls, uses)):
            continue  # passed on again, tested, stored: not only entered
        for inner, call_node in zip(uses, calls):
            autocast = _analyse_call(ctx, inner, call_node, legacy, opaque=False)
            autocast.parameter = parameter.name
            found.append(autocast)
    return found


def _parameter_receiving(ctx: FileContext, call: cst.Call, arg: cst.Arg):
    """The binding of the parameter of a function defined in this file that `arg` of `call` fills."""
    names = ctx.names
    if not isinstance(call.func, cst.Name):
        return None
    definitions = [b for b in names.bindings_of(call.func) if isinstance(b.node, cst.FunctionDef)]
    if len(definitions) != 1 or len(names.bindings_of(call.func)) != 1:
        return None
    function = definitions[0].node
    params = function.params
    if arg.keyword is not None:
        candidates = [p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == arg.keyword.value]
    else:
        if any(a.star for a in call.args[: call.args.index(arg)]):
            return None
        position = [a for a in call.args if a.keyword is None].index(arg)
        positional = [*params.posonly_params, *params.params]
        candidates = positional[position : position + 1]
    if len(candidates) != 1:
        return None
    scope_bindings = [
        b for bindings in names.scope_of(function.body).bindings.values() for b in bindings if b.node is candidates[0].name
    ]
    if len(scope_bindings) != 1 or len(names.scope_of(function.body).bindings.get(candidates[0].name.value, [])) != 1:
        return None  # the parameter is rebound in the function
    return scope_bindings[0]


def _is_alias_definition(ctx: FileContext, ref: cst.BaseExpression) -> bool:
    """`ac = torch.autocast` (or a ternary of such): its calls are analysed where they are made."""
    node: cst.CSTNode = ref
    parent = ctx.names.parent(node)
    while isinstance(parent, cst.IfExp):
        node, parent = parent, ctx.names.parent(parent)
    if isinstance(parent, cst.Attribute) and parent.value is node:
        return False
    return (
        (
            isinstance(parent, (cst.Assign, cst.AnnAssign))
            and parent.value is node
            and all(isinstance(t.target, cst.Name) for t in getattr(parent, "targets", ()))
        )
        or isinstance(parent, cst.Call)
        and _is_isinstance(parent)
    )


def _is_isinstance(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value in ("isinstance", "issubclass")


def _argument(call: cst.Call, keyword: str, position: int) -> Optional[cst.Arg]:
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return positional[position] if position < len(positional) else None


def _analyse_call(ctx: FileContext, ref, call: cst.Call, legacy: Optional[LegacyApi], opaque: bool) -> Autocast:
    opaque = opaque or any(a.star for a in call.args)
    if legacy is not None:
        devices: Optional[FrozenSet[str]] = frozenset({legacy.device})
        enabled = _argument(call, "enabled", 0)
    else:
        devices = _devices(ctx, _argument(call, "device_type", 0))
        enabled = _argument(call, "enabled", 2)
    disabled = enabled is not None and literal_value(enabled.value) is False
    dtype_arg = _argument(call, "dtype", 1)
    dtype = None
    if dtype_arg is not None:
        dtype = DtypeFollower(ctx, allowed_use=lambda r: is_dtype_use(ctx, r)).follow(dtype_arg.value)
    return Autocast(ref, call, legacy, devices, dtype_arg, dtype, disabled, opaque)


def _devices(ctx: FileContext, arg: Optional[cst.Arg]) -> Optional[FrozenSet[str]]:
    if arg is None:
        return None
    followed = Follower(ctx, check_uses=False).follow(arg.value)
    values = followed.values()
    if not followed.complete or not values or not all(isinstance(v, str) for v in values):
        return None
    return frozenset(v.split(":")[0] for v in values)


# ---------------------------------------------------------------------------------- dtypes
def dtype_name(ctx: FileContext, node: cst.CSTNode) -> Optional[str]:
    """'float16' for `torch.float16` / `torch.half` (however torch is imported), and so on."""
    found = {TORCH_DTYPES[q] for q in ctx.names.qualified_names(node) if q in TORCH_DTYPES}
    return next(iter(found)) if len(found) == 1 else None


def is_dtype_use(ctx: FileContext, ref: cst.CSTNode) -> bool:
    """Uses of a variable holding a dtype (or a dtype's name) that a new value keeps working for:
    an autocast's dtype, a comparison, a key into a dtype table, `getattr(torch, name)`."""
    if is_comparison_use(ctx, ref):
        return True
    parent = ctx.names.parent(ref)
    if isinstance(parent, cst.Index):  # DTYPES[name]
        return True
    if isinstance(parent, cst.Arg) and parent.value is ref:
        call = ctx.names.parent(parent)
        if isinstance(call, cst.Call):
            if ctx.names.qualified_names(call.func) & ANY_AUTOCAST:
                return (
                    parent.keyword is not None
                    and parent.keyword.value == "dtype"
                    or (parent.keyword is None and _position(call, parent) == 1)
                )
            return _is_getattr_torch(ctx, call) and _position(call, parent) == 1
    return False


def _position(call: cst.Call, arg: cst.Arg) -> int:
    return next(i for i, a in enumerate(call.args) if a is arg)


def _is_getattr_torch(ctx: FileContext, call: cst.Call) -> bool:
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == "getattr"
        and not ctx.names.bindings_of(call.func)
        and len(call.args) == 2
        and ctx.names.qualified_names(call.args[0].value) == frozenset({"torch"})
    )


class DtypeFollower(Follower):
    """Follows a dtype expression; its sources' values are canonical dtype names."""

    def leaf(self, expr: cst.BaseExpression) -> Any:
        if isinstance(expr, cst.Name) and not all(
            b.kind in ("import", "from-import") for b in self.names.bindings_of(expr)
        ):
            return UNKNOWN  # a variable (`amp_dtype = torch.float16`): followed to its assignment
        if isinstance(expr, (cst.Attribute, cst.Name)):
            name = dtype_name(self.ctx, expr)
            if name is not None:
                return name
        return UNKNOWN  # strings, numbers and None are not dtypes an autocast takes

    def special(self, expr, via: str, depth: int, out: Followed, seen: Set[int]) -> bool:
        if isinstance(expr, cst.Subscript):
            self._through_table(expr, out)
            return True
        if isinstance(expr, cst.Call) and _is_getattr_torch(self.ctx, expr):
            self._through_names(expr.args[1].value, DTYPE_ATTRIBUTES, out)
            return True
        return False

    def _through_table(self, expr: cst.Subscript, out: Followed) -> None:
        """`{"fp16": torch.float16, "bf16": torch.bfloat16}[key]`, the table inline or named."""
        table = _dict_literal(self.ctx, expr.value)
        if table is None or len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            out.complete = False
            return
        mapping = {}
        for element in table.elements:
            if not isinstance(element, cst.DictElement):
                out.complete = False
                return
            key = literal_value(element.key)
            value = dtype_name(self.ctx, element.value)
            if not isinstance(key, str) or value is None:
                continue  # keys we cannot read are never looked up by a literal we can
            mapping[key] = value
        self._through_names(expr.slice[0].slice.value, mapping, out)

    def _through_names(self, key: cst.BaseExpression, mapping, out: Followed) -> None:
        """A dtype chosen by name: follow the name, map each source through `mapping`."""
        followed = Follower(
            self.ctx, allowed_use=lambda r: is_dtype_use(self.ctx, r), check_uses=self.check_uses
        ).follow(key)
        out.complete = out.complete and followed.complete
        out.blocker = out.blocker or followed.blocker
        bf16_names = [k for k, v in mapping.items() if v == "bfloat16"]
        for source in followed.sources:
            dtype = mapping.get(source.value) if isinstance(source.value, str) else None
            if dtype is None:
                out.complete = False
                continue
            mapped = Source(source.node, dtype, source.via, source.choices, source.option)
            bf16 = _closest_spelling(source.value, bf16_names)
            if bf16 is None:
                mapped.no_bf16 = "the table it is looked up in has no bfloat16 entry"
            elif source.option is not None:
                mapped.no_bf16 = source.option.accepts(bf16)
            mapped.bf16 = bf16
            out.sources.append(mapped)


def _closest_spelling(old: str, candidates: List[str]) -> Optional[str]:
    """The bf16 name that matches the fp16 one's style: 'fp16' -> 'bf16', 'float16' -> 'bfloat16'."""
    preferred = {"fp16": "bf16", "float16": "bfloat16", "half": "bfloat16", "16": "bf16"}.get(old.lower())
    for candidate in candidates:
        if preferred is not None and candidate.lower() == preferred:
            return candidate
    return candidates[0] if candidates else None


def _dict_literal(ctx: FileContext, expr: cst.BaseExpression) -> Optional[cst.Dict]:
    if isinstance(expr, cst.Dict):
        return expr
    if isinstance(expr, cst.Name):
        bindings = ctx.names.bindings_of(expr)
        if len(bindings) == 1 and bindings[0].kind == "assign" and isinstance(bindings[0].value, cst.Dict):
            return bindings[0].value
    return None


def bf16_spelling(ctx: FileContext, source: Source) -> Tuple[Optional[cst.BaseExpression], bool]:
    """What to write at `source.node` so that it gives bfloat16, and whether that needs
    `import torch`; (None, False) when it cannot be spelled there."""
    node = source.node
    if node is None or source.no_bf16 is not None:
        return None, False
    if isinstance(source.bf16, str) and isinstance(node, cst.SimpleString):
        return respell_string(node, source.bf16), False
    if isinstance(node, cst.Attribute) and ctx.names.qualified_names(node.value) == frozenset({"torch"}):
        return node.with_changes(attr=cst.Name("bfloat16")), False
    if isinstance(node, (cst.Name, cst.Attribute)):  # `from torch import float16`
        torch_name, needs_import = ctx.module_reference(node, "torch")
        if torch_name is not None:
            return ctx.parse_expression(f"{torch_name}.bfloat16"), needs_import
    return None, False
