"""The AMP2 family's shared analysis: every reference to a deprecated `torch.cuda.amp` /
`torch.cpu.amp` object, how the file reaches it, and the fix that moves it to `torch.amp`.

How a reference is reached decides what the fix must change together:

- qualified (`torch.cuda.amp.autocast(...)`): the reference alone -> `torch.amp.autocast("cuda", ...)`.
- from-import (`from torch.cuda.amp import autocast`): the import becomes `from torch.amp import
  autocast` and *every* use of the imported names gets its device argument in the same fix; a
  partial fix would leave `autocast()` calls that raise TypeError.
- module alias (`from torch.cuda import amp`, `import torch.cuda.amp as amp`): likewise, the
  import and every `amp.<name>` use together.
- assignment alias (`amp_autocast = torch.cuda.amp.autocast`): the alias's calls get the device.

Uses the fix cannot follow (the object passed around as a value, stored on `self`) keep the
finding and say why; code that keeps the old API behind a version check is left to AMP206.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.analysis.string_annotations import rewritten, text_annotations
from ampmigrate.analysis.version_gates import chooses_modern, version_gate
from ampmigrate.api import AUTOCAST, GRAD_SCALER, LEGACY_AMP_MODULES, LEGACY_API, LEGACY_REEXPORTS, LegacyApi, format_version
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args
from ampmigrate.engine.names import Binding
from ampmigrate.rules.base import Rule

CODE_FOR_KIND = {"autocast": "AMP201", "grad_scaler": "AMP202", "custom_fwd": "AMP203", "custom_bwd": "AMP203"}
IMPORT_CODE = "AMP208"
# `torch.amp` itself (the module a legacy module import moves to) exists since torch 1.12.
_TORCH_AMP_SINCE = (1, 12)
ISINSTANCE_CODE = "AMP204"
GATED_CODE = "AMP206"
# Every finding of the family is on a name under one of these (the rules' `qualified_prefixes`).
LEGACY_PREFIXES = tuple(sorted(LEGACY_AMP_MODULES))

_NO_SPACE = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_LEGACY_SUBMODULES = frozenset(
    f"{module}.{sub}" for module in LEGACY_AMP_MODULES for sub in ("autocast_mode", "grad_scaler")
)
_MODERN_API = AUTOCAST | GRAD_SCALER | frozenset(
    {"torch.amp.custom_fwd", "torch.amp.custom_bwd", "torch.amp.autocast_mode.custom_fwd", "torch.amp.autocast_mode.custom_bwd"}
)


def legacy_spelling(api: LegacyApi) -> str:
    return f"torch.{api.device}.amp.{api.modern}"


def modern_spelling(api: LegacyApi, quote: str = '"') -> str:
    if api.kind in ("custom_fwd", "custom_bwd"):
        return f"torch.amp.{api.modern}(device_type={quote}{api.device}{quote})"
    return f"torch.amp.{api.modern}({quote}{api.device}{quote}, ...)"


@dataclass(eq=False)
class Site:
    """One reference to a legacy object that the user sees a finding for."""

    ref: cst.CSTNode
    api: LegacyApi
    usage: str  # call | decorator | isinstance | annotation | partial | alias | value | import
    # The code of a device (`"cuda"`, `torch.device(...)`) passed in the legacy first slot
    # (`init_scale` / `enabled`): the author meant the torch.amp signature.
    misplaced_device: Optional[str] = None

    @property
    def code(self) -> str:
        return ISINSTANCE_CODE if self.usage == "isinstance" else CODE_FOR_KIND[self.api.kind]


@dataclass(eq=False)
class Group:
    """Sites that one fix must change together (or none of)."""

    sites: List[Site]
    fix: Optional[Fix] = None
    reason: Optional[str] = None
    gate: Optional[cst.CSTNode] = None  # set when the code is a deliberate compatibility branch
    min_since: Tuple[int, int] = (0, 0)  # the newest torch any modern spelling here needs
    statement: Optional[cst.CSTNode] = None  # the legacy import the fix rewrites (AMP208's finding)


class _Unfixable(Exception):
    """Raised while planning a fix; the message says why, for the user."""


def legacy_groups(ctx: FileContext) -> List[Group]:
    return ctx.shared("legacy_api.groups", lambda: _Planner(ctx).plan())


_MISSING = object()


class _Planner:
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self._gates: Dict[int, Optional[cst.CSTNode]] = {}  # id(node) -> its compatibility gate
        self._super_inits: Optional[List[Tuple[cst.Call, cst.Call]]] = None

    # ------------------------------------------------------------------ grouping
    def plan(self) -> List[Group]:
        groups: List[Group] = []
        imports_done: Set[cst.CSTNode] = set()
        for ref, qnames in self.names.find(LEGACY_API):
            if len(qnames) != 1:
                continue
            api = LEGACY_API[next(iter(qnames))]
            if ref in self.names.store_attributes:
                continue
            route, detail = self._route(ref)
            if route == "qualified":
                groups.append(self._qualified_group(ref, api, detail))
            elif route in ("from-import", "module-alias"):
                statement = detail[0].statement
                if statement not in imports_done:
                    imports_done.add(statement)
                    groups.append(self._import_group(statement, route))
        # Legacy imports whose names are never used still deserve a finding.
        for scope in self.names.scopes:
            for bindings in scope.bindings.values():
                for binding in bindings:
                    if (
                        binding.kind in ("import", "from-import")
                        and binding.statement not in imports_done
                        and (binding.qname in LEGACY_API or binding.qname in LEGACY_AMP_MODULES)
                    ):
                        imports_done.add(binding.statement)
                        route = "from-import" if binding.qname in LEGACY_API else "module-alias"
                        groups.append(self._import_group(binding.statement, route))
        groups.extend(self._text_annotation_groups())
        for group in groups:
            self._check_gate(group)
            for site in group.sites:
                if site.usage == "call" and site.api.kind in ("autocast", "grad_scaler"):
                    device = misplaced_device(self.names, self.names.parent(site.ref))
                    site.misplaced_device = self.ctx.code(device) if device is not None else None
        return [g for g in groups if g.sites or g.statement is not None]

    def _text_annotation_groups(self) -> List[Group]:
        """`"torch.cuda.amp.GradScaler"` in a string annotation or a type comment. Names reached
        through a legacy import (`"amp.GradScaler"`, `"GradScaler"`) follow that import's fix."""
        groups: List[Group] = []
        for annotation in text_annotations(self.names):
            api = LEGACY_API.get(annotation.qname)
            if api is None or annotation.head_qname in LEGACY_AMP_MODULES or annotation.head_qname in LEGACY_API:
                continue
            if annotation.head_qname in _LEGACY_SUBMODULES:
                continue
            site = Site(annotation.node, api, "annotation")
            group = Group([site], min_since=api.since)
            new = None
            if annotation.head_qname == "torch":
                new = rewritten(annotation, self.ctx.parse_expression(f"{annotation.head}.amp.{api.modern}"))
            if new is None:
                group.reason = "the annotation's text cannot be respelled in place"
            else:
                builder = FixBuilder(f"Use `torch.amp.{api.modern}` in the annotation", SAFE, frozenset({site.code}))
                group.fix = builder.replace(annotation.node, new).build()
            groups.append(group)
        return groups

    def _route(self, ref: cst.CSTNode):
        """How `ref` reaches the legacy object (see the module docstring)."""
        if isinstance(ref, cst.Name):
            bindings = self.names.bindings_of(ref)
            imported = [b for b in bindings if b.kind == "from-import" and b.qname in LEGACY_API]
            if imported:
                return "from-import", imported
            return "indirect", None  # through an alias; handled where the alias is defined
        level = ref.value if isinstance(ref, cst.Attribute) else None
        while level is not None:
            if isinstance(level, cst.Name):
                bindings = self.names.bindings_of(level)
                legacy = [
                    b
                    for b in bindings
                    if b.kind in ("import", "from-import")
                    and (b.qname in LEGACY_AMP_MODULES or b.qname in _LEGACY_SUBMODULES)
                ]
                if legacy:
                    return "module-alias", legacy
                return "indirect", None  # self.attr alias, or a name bound some other way
            if self.names.qualified_names(level) & LEGACY_AMP_MODULES:
                return "qualified", level
            level = level.value if isinstance(level, cst.Attribute) else None
        return "indirect", None

    # ------------------------------------------------------------------ qualified references
    def _qualified_group(self, ref: cst.Attribute, api: LegacyApi, legacy_module: cst.Attribute) -> Group:
        site = Site(ref, api, self._usage(ref))
        group = Group([site], min_since=api.since)
        message = f"Use `{modern_spelling(api, self.ctx.quote)}`"
        if site.usage == "base":
            message = f"Subclass `torch.amp.{api.modern}`"
        builder = FixBuilder(message, SAFE, frozenset({site.code}))
        try:
            new_path = self._modern_path(ref, api, legacy_module, builder)
            self._rewrite_use(builder, site.ref, site.usage, api, new_path, group, depth=0)
        except _Unfixable as exc:
            group.reason = str(exc)
            return group
        group.fix = builder.build()
        return group

    def _modern_path(self, ref, api: LegacyApi, legacy_module: cst.Attribute, builder: FixBuilder) -> cst.BaseExpression:
        """`torch.amp.<name>` spelled with the file's own name for torch."""
        base = legacy_module.value  # `torch.cuda`
        torch_node = base.value if isinstance(base, cst.Attribute) else None
        if torch_node is not None and self.names.qualified_names(torch_node) == frozenset({"torch"}):
            torch_code = self.ctx.code(torch_node)
        else:
            torch_code, needs_import = self.ctx.module_reference(ref, "torch")
            if torch_code is None:
                raise _Unfixable("the name `torch` is taken here, so `torch.amp` cannot be spelled")
            if needs_import:
                builder.require_import("torch")
        return self.ctx.parse_expression(f"{torch_code}.amp.{api.modern}")

    # ------------------------------------------------------------------ imports
    def _import_group(self, statement: cst.CSTNode, route: str) -> Group:
        group = Group([], statement=statement)
        builder = FixBuilder("", SAFE, frozenset())
        try:
            if isinstance(statement, cst.ImportFrom) and route == "from-import":
                self._plan_from_import(statement, group, builder)
            else:
                self._plan_module_alias(statement, group, builder)
        except _Unfixable as exc:
            group.reason = str(exc)
        if group.reason is None and group.sites:
            apis = sorted({legacy_spelling(s.api) for s in group.sites})
            note = builder.message  # what a planning step added (why the fix is unsafe)
            how = "with the device made explicit"
            if any(s.usage == "base" for s in group.sites):
                how = "(a subclass rebased on `torch.amp.GradScaler`, the device made explicit where it is needed)"
            builder.message = f"Move {', '.join(f'`{a}`' for a in apis)} to `torch.amp` {how}{note}"
            builder.requires = frozenset(s.code for s in group.sites) | builder.requires
            group.fix = builder.build()
        elif group.reason is None and builder.targets():
            # Nothing the fix changes is reported but the import itself (AMP208).
            group.min_since = max(group.min_since, _TORCH_AMP_SINCE)
            builder.message = "Import from `torch.amp`"
            builder.requires = frozenset({IMPORT_CODE}) | builder.requires
            group.fix = builder.build()
        return group

    def _check_not_exported(self, binding: Binding) -> None:
        if self.ctx.exported(binding):
            raise _Unfixable(
                f"other modules of the project import `{binding.name}` from this one; "
                "their calls would need the device argument too"
            )
        if self.ctx.reexported(binding):
            raise _Unfixable(
                f"`{binding.name}` is re-exported from here (`__all__` or a package `__init__`); "
                "wherever it is called, the device argument must be added by hand"
            )

    def _binding_for(self, node: cst.CSTNode) -> Binding:
        scope = self.names.scope_of(node)
        for bindings in scope.bindings.values():
            for binding in bindings:
                if binding.node is node:
                    return binding
        raise _Unfixable("import binding not found")  # pragma: no cover - defensive

    def _check_other_bindings(self, binding: Binding, group: Group) -> None:
        self._check_not_exported(binding)
        for other in binding.scope.bindings.get(binding.name, []):
            if other is binding:
                continue
            if self.names.binding_qualified_names(other) & _MODERN_API:
                group.gate = other.statement or other.node  # try/except or if/else compat pair
            elif other.kind == "assign" and isinstance(other.value, cst.Name) and other.value.value in ("None", "False", "True"):
                continue  # `autocast = None` fallback: calls fail either way
            elif other.kind in ("from-import", "import") and other.statement is binding.statement:
                continue
            else:
                raise _Unfixable(f"`{binding.name}` is also bound to something else in this scope")

    def _attempt(self, group: Group, step, *args) -> None:
        """Run a planning step; an obstacle is recorded (first one wins) and planning goes on,
        so that every site is still reported."""
        try:
            step(*args)
        except _Unfixable as exc:
            if group.reason is None:
                group.reason = str(exc)

    def _plan_from_import(self, statement: cst.ImportFrom, group: Group, builder: FixBuilder) -> None:
        module = self.ctx.code(statement.module)
        if isinstance(statement.names, cst.ImportStar):
            raise _Unfixable("star import")
        for alias in statement.names:
            qname = f"{module}.{self.ctx.code(alias.name)}"
            api = LEGACY_API.get(qname)
            if api is None and qname in LEGACY_REEXPORTS:
                group.min_since = max(group.min_since, LEGACY_REEXPORTS[qname])
                continue  # the same object under torch.amp: only the import moves
            if api is None:
                raise _Unfixable(f"`{qname}` has no `torch.amp` counterpart of the same name")
            binding = self._binding_for(alias)
            self._attempt(group, self._check_other_bindings, binding, group)
            group.min_since = max(group.min_since, api.since)
            refs = self.names.references(binding)
            if not refs:
                if not self.ctx.reexported(binding):  # re-exported: the import line is AMP208's finding
                    group.sites.append(Site(alias, api, "import"))
                continue
            for ref in refs:
                usage = self._usage(ref)
                if usage not in ("annotation", "test"):
                    group.sites.append(Site(ref, api, usage))
                self._attempt(group, self._rewrite_use, builder, ref, usage, api, None, group, 0)
        new_module = modern_module(module)
        builder.replace(statement, statement.with_changes(module=self.ctx.parse_expression(new_module)))

    def _plan_module_alias(self, statement: cst.CSTNode, group: Group, builder: FixBuilder) -> None:
        for alias in statement.names if not isinstance(statement.names, cst.ImportStar) else ():
            binding = self._binding_for_alias(alias)
            if binding is None:
                continue
            if binding.qname not in LEGACY_AMP_MODULES and binding.qname not in _LEGACY_SUBMODULES:
                continue
            self._attempt(group, self._check_other_bindings, binding, group)
            for ref in self.names.references(binding):
                self._attempt(group, self._plan_module_use, ref, binding, group, builder)
            self._attempt(group, self._rewrite_module_import, statement, alias, binding, builder)

    def _plan_module_use(self, ref: cst.Name, binding: Binding, group: Group, builder: FixBuilder) -> None:
        """`amp.autocast(...)` where `amp` is the legacy module: find the API object it names."""
        node, qname = ref, binding.qname
        while qname not in LEGACY_API:
            parent = self.names.parent(node)
            if not isinstance(parent, cst.Attribute) or parent.value is not node or qname.count(".") > 5:
                raise _Unfixable(f"`{self.ctx.code(node)}` is used at line {self._line(ref)} in a way the fix cannot follow")
            node, qname = parent, f"{qname}.{parent.attr.value}"
        api = LEGACY_API[qname]
        group.min_since = max(group.min_since, api.since)
        usage = self._usage(node)
        if usage not in ("annotation", "test"):
            group.sites.append(Site(node, api, usage))
        self._rewrite_use(builder, node, usage, api, None, group, depth=0)

    def _binding_for_alias(self, alias: cst.ImportAlias) -> Optional[Binding]:
        try:
            return self._binding_for(alias)
        except _Unfixable:
            return None

    def _rewrite_module_import(self, statement, alias: cst.ImportAlias, binding: Binding, builder: FixBuilder) -> None:
        new_qname = modern_module(binding.qname)
        if isinstance(statement, cst.Import):
            # `import torch.cuda.amp as amp` -> `import torch.amp as amp` (other aliases untouched).
            if alias.asname is None:
                raise _Unfixable("`import torch.cuda.amp` without an alias binds `torch`; nothing to move")
            new_alias = alias.with_changes(name=self.ctx.parse_expression(new_qname))
            builder.replace(alias, new_alias)
            return
        parent_module, _, name = new_qname.rpartition(".")
        others = [a for a in statement.names if a is not alias]
        if not others:
            builder.replace(statement, statement.with_changes(module=self.ctx.parse_expression(parent_module)))
            return
        # `from torch.cuda import amp, Stream`: split off `from torch import amp`.
        line = self.names.parent(statement)
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or statement.lpar:
            raise _Unfixable("the import shares its line with other statements")
        kept = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(others) - 1 else a for i, a in enumerate(others)]
        moved = self.ctx.parse_statement(
            f"from {parent_module} import {self.ctx.code(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))}"
        )
        builder.replace(line, cst.FlattenSentinel([line.with_changes(body=[statement.with_changes(names=kept)]), moved]))

    # ------------------------------------------------------------------ uses
    def _usage(self, ref: cst.CSTNode) -> str:
        parent = self.names.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            return "call"
        if isinstance(parent, cst.Decorator) and parent.decorator is ref:
            return "decorator"
        arg = parent
        if isinstance(parent, cst.Element):
            tuple_node = self.names.parent(parent)
            arg = self.names.parent(tuple_node) if isinstance(tuple_node, cst.Tuple) else None
        if isinstance(arg, cst.Arg):
            call = self.names.parent(arg)
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name):
                if call.func.value in ("isinstance", "issubclass") and not self.names.bindings_of(call.func):
                    if len(call.args) == 2 and call.args[1] is arg:
                        return "isinstance"
            if isinstance(call, cst.Call) and call.args and call.args[0] is parent:
                if "functools.partial" in self.names.qualified_names(call.func):
                    return "partial"
        if isinstance(parent, cst.Arg) and parent.value is ref and not parent.star and parent.keyword is None:
            classdef = self.names.parent(parent)
            if isinstance(classdef, cst.ClassDef) and parent in classdef.bases:
                return "base"
        if self._base_init_callee(ref) is not None:
            return "base-init"
        for ancestor in self.names.ancestors(ref):
            if isinstance(ancestor, cst.Annotation):
                return "annotation"
            if isinstance(ancestor, (cst.Call, cst.BaseStatement, cst.Lambda)):
                break
        if isinstance(parent, cst.Assign) and parent.value is ref and len(parent.targets) == 1:
            if isinstance(parent.targets[0].target, cst.Name):
                return "alias"
        if self._is_presence_test(ref, parent):
            return "test"
        return "value"

    def _is_presence_test(self, ref, parent) -> bool:
        """`if autocast is not None`, `if autocast:`: reads the name without using the object."""
        if isinstance(parent, cst.Comparison) and parent.left is ref and len(parent.comparisons) == 1:
            target = parent.comparisons[0]
            return isinstance(target.operator, (cst.Is, cst.IsNot)) and (
                isinstance(target.comparator, cst.Name) and target.comparator.value == "None"
            )
        if isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is ref:
            return True
        if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
            return True
        if isinstance(parent, cst.BooleanOperation):
            return self._is_presence_test(parent, self.names.parent(parent)) or isinstance(
                self.names.parent(parent), (cst.If, cst.While, cst.IfExp, cst.BooleanOperation)
            )
        return False

    def _rewrite_use(self, builder, ref, usage, api, new_path, group, depth) -> None:
        """Add to `builder` what the use `ref` needs; `new_path` replaces the reference itself."""
        parent = self.names.parent(ref)
        if usage == "call":
            builder.replace(parent, self._modern_call(parent, api, new_path))
        elif usage == "decorator":
            if api.kind not in ("custom_fwd", "custom_bwd"):
                raise _Unfixable(f"`{self.ctx.code(ref)}` is used as a bare decorator")
            func = new_path if new_path is not None else ref
            builder.replace(ref, cst.Call(func=func, args=[self._device_keyword(api)]))
        elif usage == "test":
            pass  # only checks whether the name is set
        elif usage in ("isinstance", "annotation"):
            if new_path is not None:
                builder.replace(ref, new_path)
        elif usage == "partial":
            call = self.names.parent(parent)
            builder.replace(call, self._modern_partial(call, api, new_path))
        elif usage == "alias":
            self._rewrite_alias(builder, ref, api, new_path, group, depth)
        elif usage == "base" and api.kind == "grad_scaler":
            self._rewrite_base(builder, ref, api, new_path)
        elif usage == "base-init" and api.kind == "grad_scaler":
            call = self.names.parent(parent)
            new_call = self._with_device(call, api, skip=1)
            if new_path is not None:
                new_call = new_call.with_changes(func=new_call.func.with_changes(value=new_path))
            builder.replace(call, new_call)
        elif usage == "value" and api.kind in ("autocast", "grad_scaler") and self._passable_value(ref):
            self._rewrite_value(builder, ref, api, new_path)
        else:
            raise _Unfixable(
                f"`{self.ctx.code(ref)}` is used as a value at line {self._line(ref)}; "
                "wherever it is called, the device argument must be added by hand"
            )

    def _rewrite_alias(self, builder, ref, api, new_path, group, depth) -> None:
        """`ac = torch.cuda.amp.autocast`: the alias's calls need the device too."""
        if depth > 2:
            raise _Unfixable("alias of an alias of an alias")
        assign = self.names.parent(ref)
        target = assign.targets[0].target
        binding = self._binding_for(target)
        self._check_not_exported(binding)
        siblings = binding.scope.bindings.get(binding.name, [])
        uses = [(r, self._usage(r)) for r in self.names.references(binding)]
        if len(siblings) == 1:
            if new_path is not None:
                builder.replace(ref, new_path)
            for use, usage in uses:
                self._rewrite_use(builder, use, usage, api, None, group, depth + 1)
            return
        # Also bound to something else (`amp_autocast = suppress`): bind a partial with the device
        # instead, which only works when every call passes keywords.
        if api.kind not in ("autocast", "grad_scaler"):
            raise _Unfixable(f"`{binding.name}` is also bound to something else")
        for use, usage in uses:
            call = self.names.parent(use)
            if usage != "call" or any(a.keyword is None for a in call.args):
                raise _Unfixable(
                    f"`{binding.name}` is also bound to something else and is not only called with keywords"
                )
        builder.replace(ref, self._device_partial(builder, ref, api, new_path))

    def _device_partial(self, builder, ref, api, new_path) -> cst.Call:
        """`functools.partial(torch.amp.autocast, "cuda")`: the class with its device bound."""
        partial = self.ctx.module_reference(ref, "functools")
        if partial[0] is None:
            raise _Unfixable("the name `functools` is taken here")
        if partial[1]:
            builder.require_import("functools")
        callee = new_path if new_path is not None else ref
        return cst.Call(
            func=self.ctx.parse_expression(f"{partial[0]}.partial"),
            args=[cst.Arg(callee, comma=_comma()), cst.Arg(self.ctx.string(api.device))],
        )

    # ------------------------------------------------------------------ subclasses
    # The legacy GradScaler is torch.amp's with one method of its own: `__init__(init_scale, ...)`,
    # which calls `super().__init__(device, ...)`. Rebasing a subclass on torch.amp.GradScaler keeps
    # every method and changes one thing: the constructor it inherits or calls takes `device` first
    # (defaulting to "cuda"). So a call to the base's `__init__` gets the device in front where it
    # passes arguments by position (or the device is not "cuda"), and a class without an
    # `__init__` of its own is rebased only where no call can pass it positional arguments.

    def _base_init_callee(self, ref: cst.CSTNode) -> Optional[cst.Call]:
        """`GradScaler.__init__(self, ...)`: the call, where `ref` is its `GradScaler`."""
        attribute = self.names.parent(ref)
        if not (isinstance(attribute, cst.Attribute) and attribute.value is ref and attribute.attr.value == "__init__"):
            return None
        call = self.names.parent(attribute)
        return call if isinstance(call, cst.Call) and call.func is attribute else None

    def _with_device(self, call: cst.Call, api: LegacyApi, skip: int) -> cst.Call:
        """A call of the legacy `__init__` (after `skip` leading arguments: `self`) as a call of
        torch.amp.GradScaler's: the device goes first where any argument is positional (or
        `*args`), or where the device is not torch.amp's default "cuda"; keywords keep their meaning."""
        head, rest = list(call.args[:skip]), list(call.args[skip:])
        if len(head) != skip or any(a.keyword is not None or a.star for a in head):
            raise _Unfixable(f"`{self.ctx.code(call.func)}` is called without `self` first at line {self._line(call)}")
        if api.device == "cuda" and all(a.keyword is not None or a.star == "**" for a in rest):
            return call
        return rebuild_args(call, [*head, cst.Arg(self.ctx.string(api.device)), *rest])

    def _rewrite_base(self, builder, ref, api, new_path) -> None:
        """`class ClosureGradScaler(torch.cuda.amp.GradScaler)` -> `(torch.amp.GradScaler)`."""
        classdef = self.names.parent(self.names.parent(ref))
        name = classdef.name.value
        if len(classdef.bases) != 1 or classdef.keywords:
            raise _Unfixable(
                f"`{name}` has other bases besides `{self.ctx.code(ref)}`; which `__init__` its `super()` reaches "
                "depends on them, so the rebase is left to a person"
            )
        if classdef.decorators:
            raise _Unfixable(f"`{name}` is decorated; the decorator may depend on its constructor")
        body = classdef.body.body if isinstance(classdef.body, cst.IndentedBlock) else ()
        has_init = False
        for statement in body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
                has_init = True
            elif isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, (cst.Assign, cst.AnnAssign))
                and any(isinstance(t, cst.Name) and t.value == "__init__" for t in _targets(small))
                for small in statement.body
            ):
                raise _Unfixable(f"`{name}.__init__` is assigned; the fix cannot follow what it calls")
        for call in self._super_init_calls(classdef):
            new_call = self._with_device(call, api, skip=0)
            if new_call is not call:
                builder.replace(call, new_call)
        if not has_init:
            self._check_instantiations(builder, classdef, api)
        if new_path is not None:
            builder.replace(ref, new_path)

    def _super_init_calls(self, classdef: cst.ClassDef) -> List[cst.Call]:
        """`super().__init__(...)` (or `super(<the class>, self).__init__(...)`) in the class's methods."""
        found = []
        for call, inner in self._super_init_candidates():
            if self.names.enclosing(call, cst.ClassDef) is not classdef:
                continue
            if inner.args and not (
                len(inner.args) == 2
                and isinstance(inner.args[0].value, cst.Name)
                and inner.args[0].value.value == classdef.name.value
            ):
                raise _Unfixable(
                    f"`{self.ctx.code(inner)}` at line {self._line(inner)} names another class; "
                    "the fix cannot follow which `__init__` it reaches"
                )
            found.append(call)
        return found

    def _super_init_candidates(self) -> List[Tuple[cst.Call, cst.Call]]:
        """(call, its `super(...)`) for every `super(...).__init__(...)` of the file with the
        builtin `super`, in source order: found once per file, not once per class asked about."""
        if self._super_inits is None:
            self._super_inits = []
            for call in self.names.nodes_of_type(cst.Call):
                func = call.func
                if not (
                    isinstance(func, cst.Attribute) and func.attr.value == "__init__" and isinstance(func.value, cst.Call)
                ):
                    continue
                inner = func.value
                if isinstance(inner.func, cst.Name) and inner.func.value == "super" and not self.names.bindings_of(inner.func):
                    self._super_inits.append((call, inner))
        return self._super_inits

    def _check_instantiations(self, builder, classdef: cst.ClassDef, api: LegacyApi) -> None:
        """A subclass without `__init__` inherits torch.amp.GradScaler's after the rebase: every
        call of the class must pass keywords only. Calls this file shows are checked; a class that
        other modules may call (imported elsewhere, in `__all__`, or where that is not known) or
        that is handed on as a value makes the fix unsafe."""
        name = classdef.name.value
        if api.device != "cuda":
            raise _Unfixable(
                f"`{name}` has no `__init__` of its own: on torch.amp.GradScaler it would inherit a device "
                f'defaulting to "cuda", not "{api.device}"; give it an `__init__` calling `super().__init__("{api.device}", ...)`'
            )
        outer = self.names.scope_of(self.names.parent(classdef))
        binding = next((b for b in outer.bindings.get(name, []) if b.node is classdef), None)
        if binding is None:  # pragma: no cover - defensive
            raise _Unfixable(f"the binding of `{name}` was not found")
        unseen: Optional[cst.CSTNode] = None
        for use in self.names.references(binding):
            parent = self.names.parent(use)
            if isinstance(parent, cst.Call) and parent.func is use:
                if any(a.keyword is None and a.star != "**" for a in parent.args):
                    raise _Unfixable(
                        f"`{name}` has no `__init__` of its own and is instantiated with positional arguments at "
                        f"line {self._line(parent)}; on torch.amp.GradScaler they would bind to other parameters "
                        "(`device` comes first), so the rebase is left to a person"
                    )
                continue
            if self._usage(use) in ("isinstance", "annotation", "test") or self._names_super_class(use, classdef):
                continue
            unseen = unseen or use
        reasons = []
        others = self.ctx.imported_by_others(binding)
        if others is None:
            reasons.append("whether other modules import it is not known here")
        elif others:
            reasons.append("other modules of the project import it")
        if self.ctx.reexported(binding):
            reasons.append("it is exported (`__all__`)")
        if unseen is not None:
            reasons.append(f"it is used as a value at line {self._line(unseen)}")
        if reasons:
            builder.applicability = UNSAFE
            note = (
                f" (unsafe: `{name}` has no `__init__` and would inherit torch.amp.GradScaler's, which takes `device` "
                f"first; {', '.join(reasons)}, so a call passing positional arguments where this file cannot see "
                "would bind them to other parameters)"
            )
            if note not in builder.message:
                builder.message += note

    def _names_super_class(self, use: cst.CSTNode, classdef: cst.ClassDef) -> bool:
        """`super(Cls, self)` inside the class: the first argument names the class itself."""
        arg = self.names.parent(use)
        call = self.names.parent(arg) if isinstance(arg, cst.Arg) else None
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value == "super"
            and call.args[0] is arg
            and self.names.enclosing(call, cst.ClassDef) is classdef
        )

    # ------------------------------------------------------------------ the class as a value
    def _value_root(self, ref: cst.CSTNode) -> cst.CSTNode:
        """The expression `ref` is the value of: climbs `a if c else b` branches and `a or b`."""
        node = ref
        while True:
            parent = self.names.parent(node)
            if isinstance(parent, cst.IfExp) and parent.test is not node:
                node = parent
            elif isinstance(parent, cst.BooleanOperation):
                node = parent
            else:
                return node

    def _passable_value(self, ref: cst.CSTNode) -> bool:
        """The class is handed on whole (assigned, returned, passed, put in a container), not
        inspected (`autocast.__name__`, `x is autocast`): a partial can stand in for it."""
        root = self._value_root(ref)
        parent = self.names.parent(root)
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.Return, cst.Element, cst.DictElement)):
            return getattr(parent, "value", None) is root
        if isinstance(parent, cst.Arg):  # an argument of a call (not a base class of a class)
            return parent.value is root and not parent.star and isinstance(self.names.parent(parent), cst.Call)
        return False

    def _rewrite_value(self, builder, ref, api, new_path) -> None:
        """`ctx = torch.cuda.amp.autocast if amp else nullcontext`, `return autocast`, `f(autocast)`:
        bind the device with functools.partial. Every call the file shows must pass keywords
        (a positional `enabled` would land in the new `dtype`); a value that leaves the file's
        sight makes the fix unsafe."""
        root = self._value_root(ref)
        parent = self.names.parent(root)
        calls_seen = False
        target = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
        elif isinstance(parent, cst.AnnAssign):
            target = parent.target
        if isinstance(target, cst.Name):
            binding = self._binding_for(target)
            self._check_not_exported(binding)
            calls = []
            for use in self.names.references(binding):
                call = self.names.parent(use)
                if not (isinstance(call, cst.Call) and call.func is use):
                    calls = None
                    break
                calls.append(call)
            if calls is not None:
                for call in calls:
                    if any(a.keyword is None for a in call.args):
                        raise _Unfixable(
                            f"`{binding.name}` holds `{self.ctx.code(ref)}` and is called with positional arguments "
                            f"at line {self._line(call)}; the legacy and torch.amp signatures order them differently"
                        )
                calls_seen = True
        if not calls_seen:
            builder.applicability = UNSAFE
            note = (
                f" (unsafe: `{self.ctx.code(ref)}` at line {self._line(ref)} is called where this file cannot see; "
                "a call passing arguments positionally would now bind them to other parameters)"
            )
            if note not in builder.message:
                builder.message += note
        builder.replace(ref, self._device_partial(builder, ref, api, new_path))

    def _device_keyword(self, api: LegacyApi) -> cst.Arg:
        return cst.Arg(self.ctx.string(api.device), keyword=cst.Name("device_type"), equal=_NO_SPACE)

    def _keywords_for(self, args: Sequence[cst.Arg], api: LegacyApi) -> List[cst.Arg]:
        """Legacy positional arguments as keywords (the parameter order differs in torch.amp)."""
        out: List[cst.Arg] = []
        position = 0
        for arg in args:
            if arg.star == "*":
                raise _Unfixable("`*args` cannot be mapped onto the new signature")
            if arg.keyword is None and not arg.star:
                if position >= len(api.params):
                    raise _Unfixable("more positional arguments than the legacy signature has")
                arg = arg.with_changes(keyword=cst.Name(api.params[position]), equal=_NO_SPACE)
                position += 1
            out.append(arg)
        return out

    def _modern_call(self, call: cst.Call, api: LegacyApi, new_func) -> cst.Call:
        device = misplaced_device(self.names, call) if api.kind in ("autocast", "grad_scaler") else None
        if device is not None:
            # `GradScaler("cuda")` written for the torch.amp signature: keep the device first
            # (a `torch.device` becomes its `.type`, the only form autocast accepts).
            first = call.args[0]
            if isinstance(device, cst.Call):
                first = first.with_changes(value=cst.Attribute(value=device, attr=cst.Name("type")))
            modern = LegacyApi(api.kind, api.device, api.modern, MODERN_PARAMS[api.kind], api.since)
            args = [first, *self._keywords_for(call.args[1:], modern)]
        elif api.kind in ("autocast", "grad_scaler"):
            first = call.args[0] if call.args and call.args[0].keyword is None and not call.args[0].star else None
            if first is not None and _device_like(first.value):
                raise _Unfixable(
                    f"`{self.ctx.code(first.value)}` looks like a device, which `{legacy_spelling(api)}` takes as "
                    f"`{api.params[0]}`; write the intended `torch.amp.{api.modern}(...)` call by hand"
                )
            args = [cst.Arg(self.ctx.string(api.device)), *self._keywords_for(call.args, api)]
        else:
            positional = [a for a in call.args if a.keyword is None and not a.star]
            if len(positional) > 1 or any(a.star == "*" for a in call.args):
                raise _Unfixable("unexpected positional arguments")
            rest = [a for a in call.args if a not in positional]
            args = [*positional, self._device_keyword(api), *rest]
        new = rebuild_args(call, args)
        return new.with_changes(func=new_func) if new_func is not None else new

    def _modern_partial(self, call: cst.Call, api: LegacyApi, new_path) -> cst.Call:
        if api.kind not in ("autocast", "grad_scaler"):
            raise _Unfixable("partial of a decorator")
        first = call.args[0]
        if new_path is not None:
            first = first.with_changes(value=new_path)
        args = [first, cst.Arg(self.ctx.string(api.device)), *self._keywords_for(call.args[1:], api)]
        return rebuild_args(call, args)

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line

    # ------------------------------------------------------------------ compatibility code
    def _check_gate(self, group: Group) -> None:
        if group.gate is None:
            nodes: List[cst.CSTNode] = [group.statement] if group.statement is not None else []
            for site in group.sites:
                nodes.append(site.ref)
                if isinstance(site.ref, cst.Name):
                    nodes.extend(
                        b.statement
                        for b in self.names.bindings_of(site.ref)
                        if b.statement is not None and b.qname in LEGACY_API
                    )
            group.gate = next((gate for gate in map(self._compat_gate, nodes) if gate is not None), None)
        if group.gate is not None:
            group.fix = None
            group.reason = "kept behind a torch version check on purpose"

    def _compat_gate(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The version check or try-import that chooses between `node`'s legacy spelling and the
        modern API. One that chooses between mixed precision and none is not a gate: under a
        min-torch that makes its legacy branch always taken, that branch is fixed as any other.
        Once per node (an import statement is asked about for every use of its names)."""
        known = self._gates.get(id(node), _MISSING)
        if known is _MISSING:
            known = self._gates[id(node)] = self._find_compat_gate(node)
        return known

    def _find_compat_gate(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        start = node
        for _ in range(8):  # nested checks; a bound against pathological nesting
            gate = version_gate(self.names, start)
            if gate is None:
                return None
            if chooses_modern(self.names, gate, node, _is_modern):
                return gate
            start = gate
        return None


def _is_modern(qname: str) -> bool:
    return qname in _MODERN_API or qname == "torch.amp" or qname.startswith("torch.amp.")


# torch.amp's parameters after the device (AMP_FACTS §1, §2.2).
MODERN_PARAMS = {
    "autocast": ("dtype", "enabled", "cache_enabled"),
    "grad_scaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
}
_DEVICE_STRING = re.compile(r"(cuda|cpu|xpu|mps|hpu|mtia|xla|npu|maia|ipu)(:\d+)?")


def misplaced_device(names, call: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The first positional argument of a legacy autocast/GradScaler call when it is a device
    (a device string literal or `torch.device(...)`), which the legacy signature takes as
    `enabled` / `init_scale`."""
    if not isinstance(call, cst.Call) or not call.args:
        return None
    first = call.args[0]
    if first.keyword is not None or first.star:
        return None
    value = first.value
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return value if isinstance(text, str) and _DEVICE_STRING.fullmatch(text) else None
    if isinstance(value, cst.Call) and "torch.device" in names.qualified_names(value.func):
        return value
    return None


_DEVICE_NAME = re.compile(r"(^|_)(device|dev|device_type)(_|$)", re.IGNORECASE)


def _device_like(value: cst.BaseExpression) -> bool:
    """A variable named as a device (`device`, `args.device_type`): passed in the legacy first slot it
    was most likely meant as the torch.amp device, so no fix guesses either way."""
    name = value.attr.value if isinstance(value, cst.Attribute) else value.value if isinstance(value, cst.Name) else None
    return name is not None and bool(_DEVICE_NAME.search(name))


def modern_module(legacy: str) -> str:
    """torch.cuda.amp[.sub] / torch.cpu.amp[.sub] -> torch.amp[.sub]."""
    for prefix in LEGACY_AMP_MODULES:
        if legacy == prefix or legacy.startswith(prefix + "."):
            return "torch.amp" + legacy[len(prefix) :]
    raise ValueError(legacy)


def report_sites(ctx, message) -> None:
    """Report the sites of the rule `ctx` belongs to, with their group's fix.

    A legacy object whose `torch.amp` spelling is newer than min-torch is not reported at all:
    for such a project it is the only spelling that works on every supported torch.
    """
    min_torch = ctx.settings.min_torch
    for group in legacy_groups(ctx.file):
        if group.gate is not None:
            continue  # AMP206's
        fix, reason = group.fix, group.reason
        if fix is not None and group.min_since > min_torch:
            fix, reason = None, f"the fix needs torch >= {format_version(group.min_since)}; min-torch is {format_version(min_torch)}"
        for site in group.sites:
            if site.code == ctx.rule_code and site.api.since <= min_torch:
                ctx.report(site.ref, message(site), fix=fix, no_fix_reason=None if fix else reason)


class SiteRule(Rule):
    """An AMP2 rule that reports its own kind of site from the shared plan (see report_sites)."""

    triggers = (r"\bamp\b",)
    qualified_prefixes = LEGACY_PREFIXES

    def check(self, ctx) -> None:
        report_sites(ctx, self.message)

    @staticmethod
    def message(site: Site) -> str:  # pragma: no cover - each rule says its own
        raise NotImplementedError


def _targets(small: cst.BaseSmallStatement) -> List[cst.BaseExpression]:
    if isinstance(small, cst.Assign):
        return [t.target for t in small.targets]
    return [small.target]


def _comma() -> cst.Comma:
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def gated_message(group: Group, min_torch: Tuple[int, int]) -> str:
    api = group.sites[0].api
    return (
        f"`{legacy_spelling(api)}` is kept behind a torch version check; with min-torch "
        f"{format_version(min_torch)} the `torch.amp` spelling (torch >= {format_version(api.since)}) "
        "always exists, so the legacy branch can go"
    )


def misplaced_device_message(site: Site, slot: str) -> str:
    legacy = legacy_spelling(site.api)
    return (
        f"`{legacy}({site.misplaced_device})` passes the device as `{slot}`: the legacy class takes no device "
        f"(its first parameter is `{slot}`), so this call is broken; the torch.amp signature was meant, "
        f"`torch.amp.{site.api.modern}({site.misplaced_device})`"
    )
