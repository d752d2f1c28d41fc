"""AMP105: apex.amp's cast annotations (`@amp.half_function`, `amp.register_float_function`, ...)."""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ampmigrate.api import (
    APEX_AMP_CAST_ANNOTATIONS,
    AUTOCAST_CUDA_FLOAT_OPS,
    AUTOCAST_CUDA_HALF_OPS,
    format_version,
)
from ampmigrate.rules.apex._amp_refs import AmpRef, amp_usage
from ampmigrate.rules.apex._removal import Removal, unused_after
from ampmigrate.analysis.statements import walk
from ampmigrate.diagnostics import UNSAFE
from ampmigrate.rules.base import Rule

_CUSTOM_FWD_SINCE = (2, 4)
_DTYPE = {"half_function": "float16", "float_function": "float32"}
_AUTOGRAD_FUNCTION = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# What custom_fwd stores on its first argument (`self` of a module's forward): a class that names
# them itself would have them overwritten.
_CUSTOM_FWD_ATTRIBUTES = ("_dtype", "_fwd_used_autocast")
# Tensor methods that only reshape, move or read: autocast's lists (and apex's) cast none of them.
_NEUTRAL_METHODS = frozenset({
    "size", "dim", "numel", "view", "view_as", "reshape", "reshape_as", "contiguous", "permute", "transpose",
    "unsqueeze", "squeeze", "flatten", "expand", "expand_as", "repeat", "clone", "detach", "to", "float",
    "half", "type", "type_as", "cpu", "cuda", "new_zeros", "new_ones", "new_empty", "split", "chunk", "narrow",
    "select", "long", "int", "bool", "item", "tolist",
})
# The registrations CUDA autocast already honours: api -> module -> op names.
_AUTOCAST_ALREADY = {"register_half_function": AUTOCAST_CUDA_HALF_OPS, "register_float_function": AUTOCAST_CUDA_FLOAT_OPS}


class ApexAmpCastAnnotations(Rule):
    code = "AMP105"
    triggers = (r"\bapex\b",)  # every use resolves through an import that names apex
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        usage = amp_usage(ctx.file)
        refs = [r for r in usage.refs if r.api in APEX_AMP_CAST_ANNOTATIONS]
        for ref in refs:
            registered = _registration_autocast_keeps(ctx, ref)
            if registered is not None:
                self._drop_registration(ctx, usage, ref, *registered)
                continue
            reason = self._no_fix_reason(ctx, ref)
            if reason is not None:
                ctx.report(ref.node, self.message(ref), no_fix_reason=reason)
                continue
            dtype = _DTYPE[ref.api]
            torch, needs_import = ctx.module_reference(ref.node, "torch")
            if torch is None:
                ctx.report(ref.node, self.message(ref), no_fix_reason="the name `torch` is taken in this file")
                continue
            quote = ctx.quote
            if _decorated(ctx, ref)[0].name.value == "backward":
                fix = ctx.fix("Use `@torch.amp.custom_bwd(device_type=\"cuda\")`")
                replacement = f"{torch}.amp.custom_bwd(device_type={quote}cuda{quote})"
            else:
                unsafe = _module_forward_casts(ctx, ref)
                message = f"Use `@torch.amp.custom_fwd(device_type=\"cuda\", cast_inputs=torch.{dtype})`"
                if unsafe:
                    message += (
                        f" (unsafe: apex still cast `{unsafe}` inside the forward by its O1 lists; custom_fwd "
                        f"runs the forward with autocast off, in {dtype})"
                    )
                fix = ctx.fix(message, applicability=UNSAFE if unsafe else None)
                replacement = f"{torch}.amp.custom_fwd(device_type={quote}cuda{quote}, cast_inputs={torch}.{dtype})"
            fix.replace(ref.node, ctx.parse_expression(replacement))
            if needs_import:
                fix.require_import("torch")
            removal = Removal(ctx.names)
            for binding in usage.import_bindings:
                if unused_after(ctx.names, binding, [ref.node]):
                    removal.remove_import_binding(binding)
            removal.emit(fix)
            ctx.report(ref.node, self.message(ref), fix=fix.build())

    def _drop_registration(self, ctx, usage, ref: AmpRef, statement: cst.BaseSmallStatement, op: str) -> None:
        """`amp.register_half_function(torch, "einsum")` as a statement: CUDA autocast casts that op
        the same way by itself, so the call goes (and an apex import only it needed)."""
        dtype = "float16" if ref.api == "register_half_function" else "float32"
        fix = ctx.fix(f"Remove the registration: CUDA autocast already runs `{op}` in {dtype}")
        removal = Removal(ctx.names)
        removal.remove_statement(statement)
        for binding in usage.import_bindings:
            if unused_after(ctx.names, binding, [ref.node]):
                removal.remove_import_binding(binding)
        removal.emit(fix)
        ctx.report(
            ref.node,
            f"`amp.{ref.api}` (apex.amp, removed in May 2025) no longer runs; torch.autocast(\"cuda\") already "
            f"casts `{op}`'s inputs to {dtype}, so the registration is not needed",
            fix=fix.build(),
        )

    @staticmethod
    def message(ref: AmpRef) -> str:
        return (
            f"`amp.{ref.api}` (apex.amp, removed in May 2025) no longer runs; torch.autocast has fixed cast "
            "lists, and `torch.amp.custom_fwd(device_type=\"cuda\", cast_inputs=...)` casts the inputs of an "
            "autograd.Function"
        )

    @staticmethod
    def _no_fix_reason(ctx, ref: AmpRef) -> Optional[str]:
        if ref.api not in _DTYPE:
            if ref.api == "promote_function":
                return "torch.autocast promotes its own list of ops; a user function cannot be added to it"
            if ref.api == "register_half_function":
                return "torch.autocast's cast lists are fixed: cast the registered function's inputs with `.half()` by hand"
            return (
                "torch.autocast's cast lists are fixed: call the registered function under "
                '`torch.autocast("cuda", enabled=False)` with `.float()` inputs'
            )
        if ctx.settings.min_torch < _CUSTOM_FWD_SINCE:
            return f"`torch.amp.custom_fwd` needs torch >= {format_version(_CUSTOM_FWD_SINCE)}"
        decorator = ctx.names.parent(ref.node)
        if not isinstance(decorator, cst.Decorator) or decorator.decorator is not ref.node:
            return (
                "only `@amp.half_function`/`@amp.float_function` as a decorator of the `forward` of an "
                "autograd.Function or an nn.Module is rewritten"
            )
        func, cls = _decorated(ctx, ref)
        if func is not None and func.name.value == "backward" and cls is not None:
            # custom_bwd runs the backward as custom_fwd ran the forward (autocast off); its
            # gradients arrive in the dtype custom_fwd's outputs had, which apex cast them to
            if _forward_annotated(ctx, ref.api, cls):
                return None
            return (
                f"`@amp.{ref.api}` on `backward` is rewritten only beside the same annotation on the class's "
                "`forward` (`custom_bwd` then runs the backward as `custom_fwd` ran the forward)"
            )
        if cls is None and func is not None and func.name.value == "forward" and _module_method(ctx, func):
            # custom_fwd records its state on its first argument: here the module, which takes it
            owner = ctx.names.enclosing(func, cst.ClassDef)
            if any(isinstance(n, (cst.Name, cst.Attribute)) and _spelled(n) in _CUSTOM_FWD_ATTRIBUTES for n in _nodes(owner)):
                return "the module's class names `_dtype` or `_fwd_used_autocast`, which `custom_fwd` sets on it"
            if any(isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod") for d in func.decorators):
                return "`forward` is a staticmethod or classmethod"
            return None
        if func is None or func.name.value != "forward" or cls is None:
            return (
                "on a plain function there is no torch decorator with apex's behaviour (custom_fwd expects an "
                "autograd.Function's forward); cast the inputs by hand or call it under "
                '`torch.autocast("cuda", enabled=False)`'
            )
        return None


def cast_left_behind(file_ctx, ref: AmpRef) -> Optional[str]:
    """The dtype apex ran code in by `ref` (a registration or a cast decorator) that a migration
    to torch.autocast would silently stop: None when autocast already casts that op so, or AMP105
    rewrites the decorator to `custom_fwd`. The AMP101 migration of the file is then unsafe."""
    from ampmigrate.engine.context import RuleContext

    ctx = RuleContext(file_ctx, ApexAmpCastAnnotations())
    if _registration_autocast_keeps(ctx, ref) is not None:
        return None
    if ref.api in _DTYPE and ApexAmpCastAnnotations._no_fix_reason(ctx, ref) is None:
        return None
    return "float32" if ref.api in ("register_float_function", "float_function") else "float16"


def _decorated(ctx, ref: AmpRef) -> Tuple[Optional[cst.FunctionDef], Optional[cst.ClassDef]]:
    """The method `ref` decorates and its class, a subclass of torch.autograd.Function; (None,
    None) for anything else (the method without a class when it is not one)."""
    decorator = ctx.names.parent(ref.node)
    func = ctx.names.parent(decorator) if isinstance(decorator, cst.Decorator) else None
    if not isinstance(func, cst.FunctionDef):
        return None, None
    cls = ctx.names.enclosing(func, cst.ClassDef)
    if (
        cls is None
        or ctx.names.parent(ctx.names.parent(func)) is not cls
        or not any(ctx.names.qualified_names(base.value) & _AUTOGRAD_FUNCTION for base in cls.bases)
    ):
        return func, None
    return func, cls


def _forward_annotated(ctx, api: str, cls: cst.ClassDef) -> bool:
    """`cls`'s `forward` carries `@amp.<api>` too (it becomes `custom_fwd` with the same dtype)."""
    usage = amp_usage(ctx.file)
    for other in usage.refs:
        if other.api == api:
            func, owner = _decorated(ctx, other)
            if owner is cls and func is not None and func.name.value == "forward":
                return True
    return False


def _registration_autocast_keeps(ctx, ref: AmpRef) -> Optional[Tuple[cst.BaseSmallStatement, str]]:
    """(the statement, `module.op`) when `ref` is a statement `amp.register_half_function(M, "op")`
    (or `register_float_function`) whose op CUDA autocast casts the same way; else None."""
    table = _AUTOCAST_ALREADY.get(ref.api or "")
    call = ref.call
    if table is None or call is None or len(call.args) != 2:
        return None
    if any(arg.keyword is not None or arg.star for arg in call.args):
        return None
    module_arg, name_arg = call.args[0].value, call.args[1].value
    if not isinstance(name_arg, cst.SimpleString):
        return None
    op = name_arg.evaluated_value
    modules = [m for m in ctx.names.qualified_names(module_arg) if op in table.get(m, ())]
    statement = ctx.names.parent(call)
    if not modules or not isinstance(statement, cst.Expr):
        return None
    return statement, f"{modules[0]}.{op}"


def _module_method(ctx, func: cst.FunctionDef) -> bool:
    """`func` is a method of a class deriving (directly) from torch.nn.Module: maskrcnn-benchmark's
    `ROIAlign.forward` under `@amp.float_function`. torch's `custom_fwd` works on it as on an
    autograd.Function's forward: its first argument is the module instead of the context."""
    cls = ctx.names.enclosing(func, cst.ClassDef)
    return (
        cls is not None
        and ctx.names.parent(ctx.names.parent(func)) is cls
        and any(ctx.names.qualified_names(base.value) & _MODULE for base in cls.bases)
    )


def _module_forward_casts(ctx, ref: AmpRef) -> Optional[str]:
    """For `@amp.float_function`/`half_function` on a module's `forward`: the first call in it that
    autocast's (and apex's) lists may cast, or None. apex cast only the inputs and kept casting the
    ops inside by its O1 lists; `custom_fwd` turns autocast off inside. Equal where the body calls
    nothing those lists hold (maskrcnn-benchmark's `return roi_align(input, rois, ...)`, an
    autograd.Function's `apply` around a CUDA kernel)."""
    func, cls = _decorated(ctx, ref)
    if func is None or cls is not None or func.name.value != "forward" or not _module_method(ctx, func):
        return None
    for node in walk(func.body):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            return ctx.code(node)
        if not isinstance(node, cst.Call):
            continue
        callee = node.func
        if isinstance(callee, cst.Name):
            if not any(q.startswith("torch") for q in ctx.names.qualified_names(callee)):
                continue  # a function of the project (`roi_align = _ROIAlign.apply`)
        elif isinstance(callee, cst.Attribute) and callee.attr.value in _NEUTRAL_METHODS:
            continue
        return ctx.code(callee)
    return None


def _nodes(node: cst.CSTNode):
    return walk(node, into_scopes=True)


def _spelled(node: cst.CSTNode) -> str:
    return node.value if isinstance(node, cst.Name) else node.attr.value
