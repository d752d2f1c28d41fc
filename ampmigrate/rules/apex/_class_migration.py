"""apex classes and functions with a torch counterpart (fused optimizers, fused norms,
apex.parallel): finding every use, the torch call it becomes, and the import that goes.

Each use is fixed on its own (`FusedAdam(...)` -> `torch.optim.AdamW(..., fused=True)`,
`apex.parallel.DistributedDataParallel(m)` -> `torch.nn.parallel.DistributedDataParallel(m)`), and
the apex import goes with the last use (or, once unused, on its own). One exception: when an
imported name is also bound by a fallback (`except ImportError: from torch.nn import LayerNorm as
FusedLayerNorm`) or the import renames the class (`... as BertLayerNorm`, `... as DDP`), the import
itself becomes the torch class under the same name, together with every use's argument changes,
so the name keeps working wherever it is used.

`Mapping.convert` turns one call's arguments into the torch call's (or says why it cannot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampmigrate.api import Version, format_version
from ampmigrate.catalogue import rule_doc
from ampmigrate.diagnostics import SAFE, UNSAFE, Fix
from ampmigrate.engine.context import FileContext, FixBuilder, rebuild_args
from ampmigrate.engine.names import Binding
from ampmigrate.rules.apex._amp_options import bound_arguments, literal_value
from ampmigrate.rules.apex._import_lines import covering, fix_for
from ampmigrate.rules.apex._removal import Removal, unused_after

_NO_SPACE = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class Unconvertible(Exception):
    """Raised by a converter; the message says why, for the user."""


@dataclass
class Converted:
    target: str  # "torch.optim.AdamW"
    args: List[cst.Arg]
    unsafe: Optional[str] = None
    note: Optional[str] = None


@dataclass(frozen=True)
class Mapping:
    code: str
    target: Optional[str]  # the torch counterpart when it does not depend on the arguments
    since: Version
    convert: Optional[Callable[["CallArgs"], Converted]]  # None: no automatic fix
    reason: str = ""  # why there is no fix, when `convert` is None
    value_use_ok: bool = False  # a non-call use (isinstance, base class) may be renamed


class CallArgs:
    """A call's arguments bound to apex's signature, and helpers to build the torch call's."""

    def __init__(self, call: cst.Call, params: Tuple[str, ...], quote: str) -> None:
        bound = bound_arguments(call, params)
        if bound is None:
            if any(arg.star for arg in call.args):
                raise Unconvertible("the call passes `*args`/`**kwargs`, which the fix cannot map")
            unknown = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in params]
            if unknown:
                raise Unconvertible(f"`{unknown[0]}` is not an argument of the current apex class (an older apex?)")
            raise Unconvertible("more positional arguments than apex's signature has")
        self.call = call
        self.bound = bound
        self.params = params
        self.quote = quote

    def has(self, name: str) -> bool:
        return name in self.bound

    def literal(self, name: str, default=None):
        arg = self.bound.get(name)
        if arg is None:
            return default
        try:
            return literal_value(arg.value)
        except ValueError:
            return _UNKNOWN

    def require(self, name: str, allowed: Sequence, why: str) -> None:
        value = self.literal(name, allowed[0] if allowed else None)
        if self.has(name) and value not in allowed:
            raise Unconvertible(why)

    def keep(self, names: Sequence[str], positional_prefix: int = 0) -> List[cst.Arg]:
        """The original arguments for `names`, in order: the first `positional_prefix` parameters
        may stay positional (same position in the torch signature), the rest become keywords."""
        out: List[cst.Arg] = []
        for index, name in enumerate(names):
            arg = self.bound.get(name)
            if arg is None:
                continue
            if arg.keyword is None and (index >= positional_prefix or self.params.index(name) != index):
                arg = arg.with_changes(keyword=cst.Name(name), equal=_NO_SPACE)
            out.append(arg)
        return out

    @staticmethod
    def keyword(name: str, code: str) -> cst.Arg:
        return cst.Arg(cst.parse_expression(code), keyword=cst.Name(name), equal=_NO_SPACE)


_UNKNOWN = object()


@dataclass(eq=False)
class ClassSite:
    node: cst.CSTNode
    code: str
    short: str  # "FusedAdam"
    qname: str = ""  # "apex.optimizers.FusedAdam"


@dataclass(eq=False)
class ClassGroup:
    sites: List[ClassSite] = field(default_factory=list)
    fix: Optional[Fix] = None
    reason: Optional[str] = None


class _Unfixable(Exception):
    pass


def class_groups(ctx: FileContext, mappings: Dict[str, Mapping], key: str) -> List[ClassGroup]:
    return ctx.shared(("apex.classes", key), lambda: _Planner(ctx, mappings).plan())


class _Planner:
    def __init__(self, ctx: FileContext, mappings: Dict[str, Mapping]) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.mappings = mappings

    def plan(self) -> List[ClassGroup]:
        groups: List[ClassGroup] = []
        by_import: Dict[Binding, List[Tuple[cst.CSTNode, str]]] = {}
        qualified: List[Tuple[cst.CSTNode, str]] = []
        for node, qnames in self.names.find(self.mappings):
            if node in self.names.store_attributes or self._through_assignment(node):
                continue
            qname = sorted(qnames)[0]
            binding = self._from_import(node)
            if binding is not None:
                by_import.setdefault(binding, []).append((node, qname))
            else:
                qualified.append((node, qname))
        groups.extend(self._qualified(uses) for uses in self._by_module_import(qualified))
        for binding, uses in by_import.items():
            if self._keeps_name(binding):
                groups.append(self._imported(binding, uses))
            else:
                # Each use on its own, or all together where that lets the import go (see _by_module_import).
                groups.extend(self._qualified(together) for together in self._by_module_import(uses))
        # Imported but never used: still a finding, and the import can simply go.
        for scope in self.names.scopes:
            for bindings in scope.bindings.values():
                for binding in bindings:
                    if binding.kind == "from-import" and binding.qname in self.mappings and binding not in by_import:
                        # A re-exported name is not unused: its import line is AMP111's finding.
                        if not self.names.references(binding) and not self.ctx.reexported(binding):
                            groups.append(self._unused_import(binding))
        return groups

    # ------------------------------------------------------------------ routes
    def _through_assignment(self, node: cst.CSTNode) -> bool:
        """`optimizer_cls` after `optimizer_cls = FusedAdam`: the value is reported where it is
        bound (the right-hand side is a use of its own), not again at every read of the variable."""
        root = _root_name(node)
        if not isinstance(root, cst.Name):
            return False
        bindings = self.names.bindings_of(root)
        if not bindings or any(b.kind in ("import", "from-import") for b in bindings):
            return False
        return root is node and any(self.names.binding_qualified_names(b) & self.mappings.keys() for b in bindings)

    def _from_import(self, node: cst.CSTNode) -> Optional[Binding]:
        if not isinstance(node, cst.Name):
            return None
        found = [b for b in self.names.bindings_of(node) if b.kind == "from-import" and b.qname in self.mappings]
        return found[0] if len(found) == 1 else None

    def _by_module_import(self, uses: List[Tuple[cst.CSTNode, str]]) -> List[List[Tuple[cst.CSTNode, str]]]:
        """Uses each on their own, except that the uses of one import (`import apex` then
        `apex.parallel.X` twice, or an imported class called twice) that has no other use go
        together: the fix that rewrites them removes the import, which separate fixes applied in
        one round would each leave to the other."""
        by_binding: Dict[Binding, List[Tuple[cst.CSTNode, str]]] = {}
        alone: List[List[Tuple[cst.CSTNode, str]]] = []
        for use in uses:
            root = _root_name(use[0])
            bindings = self.names.bindings_of(root) if isinstance(root, cst.Name) else []
            if len(bindings) == 1 and bindings[0].kind in ("import", "from-import"):
                by_binding.setdefault(bindings[0], []).append(use)
            else:
                alone.append([use])
        for binding, grouped in by_binding.items():
            if len(grouped) > 1 and unused_after(self.names, binding, [node for node, _ in grouped]):
                alone.append(grouped)
            else:
                alone.extend([use] for use in grouped)
        return alone

    def _qualified(self, uses: List[Tuple[cst.CSTNode, str]]) -> ClassGroup:
        group = ClassGroup([])
        for node, qname in uses:
            group.sites.append(ClassSite(node, self.mappings[qname].code, qname.rsplit(".", 1)[1], qname))
        builder = FixBuilder("", SAFE, frozenset(site.code for site in group.sites))
        self.needs_torch = False
        messages: List[str] = []
        unsafe: List[str] = []
        try:
            for node, qname in uses:
                root = _root_name(node)
                if isinstance(root, cst.Name) and not self.names.bindings_of(root):
                    raise _Unfixable(f"`{root.value}` comes from a `*` import; import it by name and the fix can follow it")
                if not isinstance(root, cst.Name) or not any(
                    b.kind in ("import", "from-import") for b in self.names.bindings_of(root)
                ):
                    raise _Unfixable(f"`{self.ctx.code(node)}` is bound by an assignment the fix does not follow")
                message, why = self._rewrite_use(builder, node, self.mappings[qname], spell_torch=True)
                messages.append(message)
                if why:
                    unsafe.append(why)
            removal = Removal(self.names)
            root = _root_name(uses[0][0])
            for binding in self.names.bindings_of(root):
                if binding.kind in ("import", "from-import") and unused_after(self.names, binding, [n for n, _ in uses]):
                    self._check_not_reexported(binding)
                    removal.remove_import_binding(binding)
            removal.emit(builder, import_torch=self.needs_torch)
        except _Unfixable as exc:
            group.reason = str(exc)
            return group
        group.fix = self._finish(builder, "; ".join(dict.fromkeys(messages)), "; ".join(dict.fromkeys(unsafe)) or None)
        return group

    def _imported(self, binding: Binding, uses: List[Tuple[cst.CSTNode, str]]) -> ClassGroup:
        mapping = self.mappings[binding.qname]
        short = binding.qname.rsplit(".", 1)[1]
        group = ClassGroup([ClassSite(node, mapping.code, short, binding.qname) for node, _ in uses])
        builder = FixBuilder("", SAFE, frozenset({mapping.code}))
        self.needs_torch = False
        try:
            keep_name = self._keeps_name(binding)
            messages, unsafe = [], []
            targets: Set[str] = set()
            for node, _ in uses:
                message, why = self._rewrite_use(builder, node, mapping, spell_torch=not keep_name, targets=targets)
                messages.append(message)
                if why:
                    unsafe.append(why)
            if keep_name:
                if len(targets) != 1:
                    raise _Unfixable(f"the uses of `{binding.name}` map to different torch classes")
                self._rewrite_import(builder, binding, targets.pop())
            else:
                self._check_not_reexported(binding)
                removal = Removal(self.names)
                removal.remove_import_binding(binding)
                removal.emit(builder, import_torch=self.needs_torch)
            if keep_name and self.needs_torch:
                builder.require_import("torch")
        except _Unfixable as exc:
            group.reason = str(exc)
            return group
        group.fix = self._finish(builder, "; ".join(dict.fromkeys(messages)), "; ".join(dict.fromkeys(unsafe)) or None)
        return group

    def _unused_import(self, binding: Binding) -> ClassGroup:
        mapping = self.mappings[binding.qname]
        short = binding.qname.rsplit(".", 1)[1]
        group = ClassGroup([ClassSite(binding.node, mapping.code, short, binding.qname)])
        if rule_doc(mapping.code).fix == "none":
            group.reason = "imported but never used here; remove the import"
            return group
        builder = FixBuilder(f"Remove the unused `{short}` import", SAFE, frozenset({mapping.code}))
        removal = Removal(self.names)
        removal.remove_import_binding(binding)
        removal.emit(builder)
        group.fix = builder.build()
        return group

    def _check_not_reexported(self, binding: Binding) -> None:
        if self.ctx.reexported(binding):
            raise _Unfixable(
                f"`{binding.name}` is re-exported from here (`__all__` or a package `__init__`); the modules that "
                "import it must be migrated first"
            )

    def _keeps_name(self, binding: Binding) -> bool:
        """Rewrite the import under the same name (rather than the uses) when a fallback also
        binds it, or when the import renames the class."""
        others = [b for b in binding.scope.bindings.get(binding.name, []) if b is not binding]
        alias = binding.node
        renamed = isinstance(alias, cst.ImportAlias) and alias.asname is not None
        return bool(others) or renamed

    # ------------------------------------------------------------------ uses
    def _rewrite_use(self, builder, node, mapping: Mapping, *, spell_torch: bool, targets: Optional[Set[str]] = None):
        if mapping.convert is None:
            raise _Unfixable(mapping.reason)
        if mapping.since > self.ctx.settings.min_torch:
            raise _Unfixable(
                f"the torch counterpart needs torch >= {format_version(mapping.since)}; min-torch is "
                f"{format_version(self.ctx.settings.min_torch)}"
            )
        parent = self.names.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            try:
                converted = mapping.convert(CallArgs(parent, _params_of(mapping), self.ctx.quote))
            except Unconvertible as exc:
                raise _Unfixable(f"`{self.ctx.code(node)}(...)` at line {self._line(node)}: {exc}")
            if targets is not None:
                targets.add(converted.target)
            new_call = rebuild_args(parent, converted.args)
            if spell_torch:
                new_call = new_call.with_changes(func=self._spell(node, converted.target, builder))
            builder.replace(parent, new_call)
            message = f"Use `{converted.target}`" + (f" ({converted.note})" if converted.note else "")
            return message, converted.unsafe
        if not mapping.value_use_ok or mapping.target is None:
            raise _Unfixable(
                f"`{self.ctx.code(node)}` is used as a value at line {self._line(node)}; its torch counterpart "
                "depends on the arguments of each call"
            )
        if targets is not None:
            targets.add(mapping.target)
        if spell_torch:
            builder.replace(node, self._spell(node, mapping.target, builder))
        return f"Use `{mapping.target}`", None

    def _spell(self, at: cst.CSTNode, target: str, builder: FixBuilder) -> cst.BaseExpression:
        """`torch.nn.LayerNorm` in the file's own spelling (`nn.LayerNorm` after `from torch import nn`)."""
        module, _, name = target.rpartition(".")
        for prefix in _prefixes(module):
            bound, _needs = self.ctx.module_reference(at, prefix)
            if bound is not None and not _needs:
                rest = module[len(prefix):]
                return self.ctx.parse_expression(f"{bound}{rest}.{name}")
        torch, needs = self.ctx.module_reference(at, "torch")
        if torch is None:
            raise _Unfixable("the name `torch` is taken in this file")
        if needs:
            self.needs_torch = True
        return self.ctx.parse_expression(f"{torch}{module[len('torch'):]}.{name}")

    def _rewrite_import(self, builder: FixBuilder, binding: Binding, target: str) -> None:
        statement = binding.statement
        if not isinstance(statement, cst.ImportFrom) or isinstance(statement.names, cst.ImportStar) or len(statement.names) != 1:
            raise _Unfixable("the import of the apex class shares its statement with other names")
        module, _, name = target.rpartition(".")
        alias = statement.names[0]
        new_alias = alias.with_changes(name=cst.Name(name))
        if name == binding.name:
            new_alias = new_alias.with_changes(asname=None)
        elif alias.asname is None:
            new_alias = new_alias.with_changes(
                asname=cst.AsName(name=cst.Name(binding.name), whitespace_before_as=cst.SimpleWhitespace(" "),
                                  whitespace_after_as=cst.SimpleWhitespace(" "))
            )
        builder.replace(
            statement,
            statement.with_changes(module=self.ctx.parse_expression(module), names=[new_alias], relative=[]),
        )

    def _finish(self, builder: FixBuilder, message: str, unsafe: Optional[str]) -> Fix:
        builder.message = message + (f"; unsafe: {unsafe}" if unsafe else "")
        builder.applicability = UNSAFE if unsafe else SAFE
        return builder.build()

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line


def _root_name(node: cst.CSTNode) -> cst.CSTNode:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node


def _prefixes(module: str) -> List[str]:
    """`torch.nn.parallel` -> ['torch.nn.parallel', 'torch.nn'] (longest first, not bare torch)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 1, -1)]


def _params_of(mapping: Mapping) -> Tuple[str, ...]:
    return getattr(mapping.convert, "params", ())


def report_class_sites(
    ctx,
    mappings: Dict[str, Mapping],
    key: str,
    message: Callable[[ClassSite], str],
    import_message: Optional[Callable[[str], str]] = None,
) -> None:
    """Report the rule's sites; with `import_message`, also each import statement of its names
    that are used (an unused one is a site already), once, with the fix of the uses that changes it."""
    groups = class_groups(ctx.file, mappings, key)
    for group in groups:
        for site in group.sites:
            if site.code == ctx.rule_code:
                ctx.report(site.node, message(site), fix=group.fix, no_fix_reason=None if group.fix else group.reason)
    if import_message is None:
        return
    reported = covering(ctx, (site.node for group in groups for site in group.sites))
    done: Set[cst.CSTNode] = set()
    for scope in ctx.names.scopes:
        for bindings in scope.bindings.values():
            for binding in bindings:
                mapping = mappings.get(binding.qname) if binding.kind == "from-import" else None
                statement = binding.statement
                if mapping is None or mapping.code != ctx.rule_code or statement in done:
                    continue
                done.add(statement)
                if id(statement) in reported:
                    continue  # an unused name of it is a site already
                fix = fix_for(ctx, (g.fix for g in groups), statement)
                related = [g for g in groups if any(_bound_by(ctx, site.node, statement) for site in g.sites)]
                reason = next((g.reason for g in related if g.fix is None and g.reason), None)
                if fix is None and reason is None:
                    reason = "it goes with the fix of its last use"
                ctx.report(statement, import_message(binding.qname.rsplit(".", 1)[1]), fix=fix,
                           no_fix_reason=None if fix else reason)


def _bound_by(ctx, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    root = _root_name(node)
    return isinstance(root, cst.Name) and any(b.statement is statement for b in ctx.names.bindings_of(root))
