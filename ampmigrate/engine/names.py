"""One pass over a module that resolves names through imports and scopes.

This is a deliberately small resolver for what the rules need, in one traversal: Python's scoping
rules (module, class, function, lambda, comprehension; `global`/`nonlocal`; class bodies not
visible from methods), import bindings (`import a.b as c`, `from a import b`), simple aliases
(`x = torch.cuda.amp.autocast`), attributes assigned on `self` in methods, and the parent of every
node. It answers the questions LibCST's QualifiedNameProvider answers (which dotted names can
this expression denote?) at a fraction of its cost, and a little more: which class an instance
was created from, and every reference to a binding.

Resolution is flow-insensitive, like LibCST's: a name bound twice in one scope (an import in
`try` and `amp = None` in `except`) denotes the union of both. Rules decide what a partial match
means; the resolver never guesses from text.

engine/prescreen.py decides from `ast`, before this pass runs, which qualified names a file can
reach, and must over-approximate this resolver: teach it any new way of reaching a name taught
here (tests/test_prescreen.py compares findings with and without it).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.api import STAR_EXPORTS
from ampmigrate.engine.cst_walk import KINDS, NODE, SEQUENCE, field_order, hooks, kind_of

EMPTY: FrozenSet[str] = frozenset()


def imported_module(call: cst.Call) -> Optional[str]:
    """The absolute module a call `import_module("a.b")` names by a literal (no `package=`), else
    None: the caller checks that the function is importlib's (engine/prescreen.py reads the same
    shape from `ast`)."""
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    value = call.args[0].value
    if not isinstance(value, cst.SimpleString) or value.prefix.lower() not in ("", "r"):
        return None
    module = value.evaluated_value
    if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
        return None
    return module

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


class Scope:
    __slots__ = ("kind", "node", "parent", "bindings", "global_names", "nonlocal_names", "self_attrs")

    def __init__(self, kind: str, node: cst.CSTNode, parent: Optional["Scope"]) -> None:
        self.kind = kind  # "module" | "class" | "function" | "lambda" | "comprehension"
        self.node = node
        self.parent = parent
        self.bindings: Dict[str, List[Binding]] = {}
        self.global_names: Set[str] = set()
        self.nonlocal_names: Set[str] = set()
        # For class scopes: values assigned to `self.<attr>` in its methods (and class-level
        # annotated names), by attribute name.
        self.self_attrs: Dict[str, List[Binding]] = {}

    def __repr__(self) -> str:
        return f"<Scope {self.kind} {getattr(getattr(self.node, 'name', None), 'value', '')}>"


class Binding:
    """One place where a name gets a value."""

    __slots__ = ("name", "kind", "scope", "node", "statement", "value", "qname", "annotation")

    def __init__(
        self,
        name: str,
        kind: str,
        scope: Scope,
        node: cst.CSTNode,
        statement: Optional[cst.CSTNode],
        value: Optional[cst.BaseExpression] = None,
        qname: Optional[str] = None,
        annotation: Optional[cst.BaseExpression] = None,
    ) -> None:
        self.name = name
        # "import" | "from-import" | "assign" | "annotation" | "augassign" | "param" | "def" |
        # "class" | "for" | "with" | "except" | "walrus" | "match" | "star-import"
        self.kind = kind
        self.scope = scope
        self.node = node  # the target Name, param Name, def/class node, or ImportAlias
        self.statement = statement  # the small statement or compound statement that binds
        self.value = value  # the assigned expression, for simple assignments and `with ... as`
        self.qname = qname  # the dotted name an import binds
        self.annotation = annotation

    def __repr__(self) -> str:
        return f"<Binding {self.kind} {self.name}={self.qname or ''}>"


class NameIndex:
    """The result of the pass. All node-keyed maps use node identity."""

    def __init__(self, module: cst.Module, star_bound: Optional[Dict[str, str]] = None) -> None:
        self.module = module
        # Free names that the file's `from X import *` of modules of the run bind, as the project
        # index worked them out (engine/apex_star.py): {name: qualified name}. A name bound
        # nowhere in the file resolves to it, like a name of `api.STAR_EXPORTS`.
        self.star_bound: Dict[str, str] = dict(star_bound or {})
        self.module_scope = Scope("module", module, None)
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.loads: Dict[cst.Name, Scope] = {}
        self.scope_entries: Dict[cst.CSTNode, Scope] = {}
        self.scopes: List[Scope] = [self.module_scope]
        self.has_star_import = False
        self._apex_unbound: Optional[bool] = None  # `_apex_free`, worked out once
        # `from M import *` of a module whose names are known (api.STAR_EXPORTS): (scope, M).
        self.star_imports: List[Tuple[Scope, str]] = []
        # `x.attr` nodes: candidates for `self.attr` aliases assigned in methods.
        self.name_attributes: List[cst.Attribute] = []
        # Attribute nodes that are assignment targets (`self.x = ...`): stores, not references.
        self.store_attributes: Set[cst.Attribute] = set()
        self._qname_memo: Dict[cst.CSTNode, FrozenSet[str]] = {}
        self._instance_memo: Dict[cst.CSTNode, FrozenSet[str]] = {}
        self._in_progress: Set[Tuple[int, int]] = set()
        # id(a scope's list of bindings of one name) -> the qualified names of a load seeing it,
        # for loads resolved outside any other resolution (see _compute_qualified_names).
        self._bindings_qnames: Dict[int, FrozenSet[str]] = {}
        self._method_scopes: Dict[int, Optional[Scope]] = {}  # id(a list of bindings) -> its class scope
        self._bindings_instances: Dict[int, FrozenSet[str]] = {}  # the same, for instance_classes
        self._references: Optional[Dict[Binding, List[cst.Name]]] = None
        self._qualified: Optional[List[Tuple[cst.BaseExpression, FrozenSet[str]]]] = None
        self._qualified_at: Optional[Dict[str, List[int]]] = None
        self._by_type: Dict[object, List[cst.CSTNode]] = {}
        self._exact_types: Optional[Dict[type, List[int]]] = None
        self._in_order: List[cst.CSTNode] = []
        _Indexer(self).run(module)  # module.visit(...), without rebuilding the tree

    def release(self) -> None:
        """Let go of the tree once the file is done. Scopes and bindings point at each other,
        and visitors defined inside functions hold this index in cycles: what they keep alive
        would otherwise be freed only by a collection walking the whole tree."""
        for scope in self.scopes:
            scope.bindings = {}
            scope.self_attrs = {}
            scope.node = None  # type: ignore[assignment]
        self.scopes = []
        self.parents = {}
        self.loads = {}
        self.scope_entries = {}
        self.name_attributes = []
        self.store_attributes = set()
        self._qname_memo = {}
        self._instance_memo = {}
        self._bindings_qnames = {}
        self._method_scopes = {}
        self._bindings_instances = {}
        self._references = None
        self._qualified = None
        self._qualified_at = None
        self._by_type = {}
        self._exact_types = None
        self._in_order = []
        self.module = None  # type: ignore[assignment]

    # ----------------------------------------------------------------------------- structure
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        node = self.parents.get(node)
        while node is not None:
            yield node
            node = self.parents.get(node)

    def nodes_of_type(self, kinds) -> List[cst.CSTNode]:
        """Every node of the given type(s), in source order (from the pass's parent map, so no
        second traversal of the tree)."""
        found = self._by_type.get(kinds)
        if found is None:
            if self._exact_types is None:
                # One pass over the map for all the queries of the file: node type -> the
                # positions (in source order) of its nodes.
                positions: Dict[type, List[int]] = {}
                for position, node in enumerate(self.parents):
                    kind = type(node)
                    at = positions.get(kind)
                    if at is None:
                        positions[kind] = [position]
                    else:
                        at.append(position)
                self._exact_types = positions
                self._in_order = list(self.parents)
            lists = [at for kind, at in self._exact_types.items() if issubclass(kind, kinds)]
            order = self._in_order
            if len(lists) == 1:
                found = [order[i] for i in lists[0]]
            else:
                found = [order[i] for i in sorted(i for at in lists for i in at)]
            self._by_type[kinds] = found
        return found

    def enclosing(self, node: cst.CSTNode, kinds) -> Optional[cst.CSTNode]:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, kinds):
                return ancestor
        return None

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement (line or compound statement) that contains `node` (or is it)."""
        current: Optional[cst.CSTNode] = node
        while current is not None and not isinstance(current, cst.BaseStatement):
            current = self.parents.get(current)
        return current

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The scope in which the expression `node` is evaluated."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            scope = self.scope_entries.get(current)
            if scope is not None:
                return scope
            current = self.parents.get(current)
        return self.module_scope

    # ----------------------------------------------------------------------------- lookup
    def lookup(self, name: str, scope: Scope) -> List[Binding]:
        """Bindings a load of `name` in `scope` can see, by Python's scoping rules."""
        if name in scope.global_names:
            return self.module_scope.bindings.get(name, [])
        if name not in scope.nonlocal_names and name in scope.bindings:
            return scope.bindings[name]
        current = scope.parent
        while current is not None:
            # Class bodies are not visible from the functions and comprehensions inside them.
            if current.kind != "class" and name in current.bindings:
                return current.bindings[name]
            current = current.parent
        return []

    def bindings_of(self, name: cst.Name) -> List[Binding]:
        scope = self.loads.get(name)
        if scope is None:
            return []
        return self.lookup(name.value, scope)

    def is_free(self, name: str, scope: Scope) -> bool:
        """True when `name` is bound nowhere that a load in `scope` could see (nor by `*`)."""
        return not self.lookup(name, scope) and not self.has_star_import

    def dunder_all(self) -> FrozenSet[str]:
        """The names a module-level `__all__` lists (`=`, `+=` of string lists or tuples)."""
        names: Set[str] = set()
        for binding in self.module_scope.bindings.get("__all__", []):
            statement = self.parents.get(binding.node)
            while statement is not None and not isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                statement = self.parents.get(statement)
            value = getattr(statement, "value", None)
            if isinstance(value, (cst.List, cst.Tuple)):
                for element in value.elements:
                    if isinstance(element.value, cst.SimpleString):
                        names.add(element.value.evaluated_value)
        return frozenset(names)

    def references(self, binding: Binding) -> List[cst.Name]:
        """Every load that can see `binding`."""
        if self._references is None:
            # A lookup answers with one scope's list of bindings of the name, and a binding is in
            # one such list: the loads of each list, in order, are the references of each of its
            # bindings (one pass over the loads, whatever the number of rebindings of a name).
            lists: Dict[int, Tuple[List[Binding], List[cst.Name]]] = {}
            for name, scope in self.loads.items():
                found = self.lookup(name.value, scope)
                if found:
                    entry = lists.get(id(found))
                    if entry is None:
                        entry = lists[id(found)] = (found, [])
                    entry[1].append(name)
            refs: Dict[Binding, List[cst.Name]] = {}
            for found, loads in lists.values():
                for each in found:
                    refs.setdefault(each, []).extend(loads)
            self._references = refs
        return self._references.get(binding, [])

    # ----------------------------------------------------------------------------- qualified names
    def qualified_names(self, node: cst.CSTNode) -> FrozenSet[str]:
        """Dotted names `node` can denote: `amp.autocast` -> {'torch.cuda.amp.autocast'}."""
        return self._memoized(self._qname_memo, node, self._compute_qualified_names)

    def _memoized(self, memo, node, compute) -> FrozenSet[str]:
        """`compute(node)` once per node; a cycle (`x = x`) resolves to nothing."""
        found = memo.get(node)
        if found is not None:
            return found
        key = (id(memo), id(node))
        if key in self._in_progress:
            return EMPTY
        self._in_progress.add(key)
        try:
            result = compute(node)
        finally:
            self._in_progress.discard(key)
        memo[node] = result
        return result

    def _compute_qualified_names(self, node: cst.CSTNode) -> FrozenSet[str]:
        if isinstance(node, cst.Name):
            bindings = self.bindings_of(node)
            # A load resolved on its own (nothing else in progress: no cycle can cut its answer
            # short) has the answer of every such load that sees the same bindings: a name bound
            # hundreds of times is resolved once, not once per load.
            alone = len(self._in_progress) == 1
            if alone and bindings:
                known = self._bindings_qnames.get(id(bindings))
                if known is not None:
                    return known
            result: Set[str] = set()
            for binding in bindings:
                result |= self.binding_qualified_names(binding)
            if not bindings and (self.star_imports or self.star_bound) and node in self.loads:
                result |= self._star_names(node)
            elif not bindings and node.value == "apex" and node in self.loads and self._apex_free():
                result.add("apex")  # `apex.amp.initialize(...)` with apex imported nowhere (see `_apex_free`)
            answer = frozenset(result)
            if alone and bindings:
                self._bindings_qnames[id(bindings)] = answer
            return answer
        if isinstance(node, cst.Attribute):
            base = self.qualified_names(node.value)
            attr = node.attr.value
            if base:
                return frozenset(f"{q}.{attr}" for q in base)
            # `self.attr`, where a method assigned `self.attr = torch.cuda.amp.autocast`.
            result = set()
            for binding in self.self_attribute_bindings(node):
                result |= self.binding_qualified_names(binding)
            return frozenset(result)
        return EMPTY

    def _apex_free(self) -> bool:
        """The file never binds the name `apex` (no import, assignment, parameter, ... in any
        scope) and has no `*` import: a load of it can only be the apex package a caller put in
        the module's globals, or a NameError (facebookresearch/GDT's `main_stica.py` calls
        `apex.amp.initialize` and never imports apex). Either way it names apex, not something of
        the file's own."""
        if self._apex_unbound is None:
            self._apex_unbound = not self.has_star_import and not any("apex" in scope.bindings for scope in self.scopes)
        return self._apex_unbound

    def _star_names(self, node: cst.Name) -> FrozenSet[str]:
        """A name bound nowhere, in a scope that sees `from M import *` of a module known to
        export it: `M.name`."""
        bound = self.star_bound.get(node.value)
        if bound is not None:  # star imports are at module level: every scope sees them
            return frozenset({bound})
        visible = set()
        scope: Optional[Scope] = self.loads[node]
        while scope is not None:
            visible.add(id(scope))
            scope = scope.parent
        return frozenset(
            f"{module}.{node.value}"
            for scope, module in self.star_imports
            if id(scope) in visible and node.value in STAR_EXPORTS.get(module, ())
        )

    def binding_qualified_names(self, binding: Binding) -> FrozenSet[str]:
        if binding.qname is not None:
            return frozenset({binding.qname})
        if binding.kind == "assign" and binding.value is not None:
            return self._alias_names(binding.value)
        return EMPTY

    def _alias_names(self, value: cst.BaseExpression) -> FrozenSet[str]:
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self.qualified_names(value)
        if isinstance(value, cst.IfExp):  # x = torch.amp.autocast if new else torch.cuda.amp.autocast
            return self._alias_names(value.body) | self._alias_names(value.orelse)
        if isinstance(value, cst.Call):  # amp = importlib.import_module("apex.amp")
            module = imported_module(value)
            if module is not None and "importlib.import_module" in self.qualified_names(value.func):
                return frozenset({module})
        return EMPTY

    def qualified_expressions(self) -> List[Tuple[cst.BaseExpression, FrozenSet[str]]]:
        """Every Name load with a qualified name, and every attribute chain built on one."""
        if self._qualified is None:
            found: List[Tuple[cst.BaseExpression, FrozenSet[str]]] = []
            roots: List[cst.BaseExpression] = list(self.loads)
            # `self.ac`, where a method assigned `self.ac = torch.cuda.amp.autocast`.
            roots.extend(
                node
                for node in self.name_attributes
                if node.value in self.loads and not self.qualified_names(node.value)
            )
            for root in roots:
                node: cst.BaseExpression = root
                names = self.qualified_names(node)
                if not names or node in self.store_attributes:
                    continue
                found.append((node, names))
                parent = self.parents.get(node)
                while isinstance(parent, cst.Attribute) and parent.value is node:
                    node = parent
                    if node in self.store_attributes:
                        break
                    found.append((node, self.qualified_names(node)))
                    parent = self.parents.get(node)
            self._qualified = found
        return self._qualified

    def find(self, qnames: Iterable[str]) -> List[Tuple[cst.BaseExpression, FrozenSet[str]]]:
        """Expressions that can denote one of `qnames`, in source order of discovery."""
        wanted = frozenset(qnames)
        found = self.qualified_expressions()
        if self._qualified_at is None:
            # qualified name -> the positions in `found` of the expressions that can denote it:
            # each rule's `find` reads its own names' entries, not every expression of the file.
            at: Dict[str, List[int]] = {}
            for position, (_, names) in enumerate(found):
                for qname in names:
                    at.setdefault(qname, []).append(position)
            self._qualified_at = at
        positions = sorted({p for qname in wanted for p in self._qualified_at.get(qname, ())})
        return [(found[p][0], found[p][1] & wanted) for p in positions]

    # ----------------------------------------------------------------------------- instances
    def self_attribute_bindings(self, node: cst.Attribute) -> List[Binding]:
        """For `self.attr` inside a method: the `self.attr = ...` bindings of its class."""
        if not isinstance(node.value, cst.Name):
            return []
        class_scope = self.method_class_scope(node.value)
        if class_scope is None:
            return []
        return class_scope.self_attrs.get(node.attr.value, [])

    def method_class_scope(self, name: cst.Name) -> Optional[Scope]:
        """If `name` is the first parameter of a method (its `self`), the class's scope."""
        bindings = self.bindings_of(name)
        if not bindings:
            return None
        # The answer depends on the list alone (a scope's own, alive with the index): asked for
        # every `x.attr` of the file, and a module-level name may be bound hundreds of times.
        found = self._method_scopes.get(id(bindings), False)
        if found is False:
            found = self._method_scopes[id(bindings)] = self._method_class_scope(bindings)
        return found

    def _method_class_scope(self, bindings: List[Binding]) -> Optional[Scope]:
        for binding in bindings:
            if binding.kind != "param":
                continue
            func_scope = binding.scope
            func = func_scope.node
            if (
                isinstance(func, cst.FunctionDef)
                and func_scope.parent is not None
                and func_scope.parent.kind == "class"
                and func.params.params
                and func.params.params[0].name is binding.node
            ):
                return func_scope.parent
        return None

    def instance_classes(self, node: cst.CSTNode) -> FrozenSet[str]:
        """Qualified names of the classes whose instances `node` can hold.

        `GradScaler()` -> {'torch.cuda.amp.GradScaler'}; a name assigned from such a call, a
        parameter annotated with such a class (also `Optional[...]`), or `self.scaler` assigned
        one in any method of the class.
        """
        return self._memoized(self._instance_memo, node, self._compute_instance_classes)

    def _compute_instance_classes(self, node: cst.CSTNode) -> FrozenSet[str]:
        if isinstance(node, cst.Call):
            return self.qualified_names(node.func)
        if isinstance(node, cst.IfExp):
            return self.instance_classes(node.body) | self.instance_classes(node.orelse)
        if isinstance(node, cst.BooleanOperation):
            return self.instance_classes(node.left) | self.instance_classes(node.right)
        if isinstance(node, cst.Name):
            return self._list_instance_classes(self.bindings_of(node))
        if isinstance(node, cst.Attribute):
            return self._list_instance_classes(self.self_attribute_bindings(node))
        return EMPTY

    def _list_instance_classes(self, bindings: List[Binding]) -> FrozenSet[str]:
        """`_bindings_instance_classes` of a scope's list of bindings of a name (or of a class's
        `self.<attr>`), once per list for the loads resolved on their own, as qualified names
        are (see _compute_qualified_names): a name bound hundreds of times is asked at each load."""
        alone = len(self._in_progress) == 1
        if alone and bindings:
            known = self._bindings_instances.get(id(bindings))
            if known is not None:
                return known
        answer = self._bindings_instance_classes(bindings)
        if alone and bindings:
            self._bindings_instances[id(bindings)] = answer
        return answer

    def _bindings_instance_classes(self, bindings: Iterable[Binding]) -> FrozenSet[str]:
        result: Set[str] = set()
        for binding in bindings:
            if binding.value is not None and binding.kind in ("assign", "walrus", "annotation"):
                result |= self.instance_classes(binding.value)
            if binding.annotation is not None:
                result |= self.annotation_classes(binding.annotation)
        return frozenset(result)

    def annotation_classes(self, annotation: cst.BaseExpression) -> FrozenSet[str]:
        if isinstance(annotation, (cst.Name, cst.Attribute)):
            return self.qualified_names(annotation)
        if isinstance(annotation, cst.Subscript):  # Optional[X], Union[X, None]
            result: Set[str] = set()
            for element in annotation.slice:
                if isinstance(element.slice, cst.Index):
                    result |= self.annotation_classes(element.slice.value)
            return frozenset(result)
        if isinstance(annotation, cst.BinaryOperation):  # X | None
            return self.annotation_classes(annotation.left) | self.annotation_classes(annotation.right)
        if isinstance(annotation, cst.Tuple):
            result = set()
            for element in annotation.elements:
                result |= self.annotation_classes(element.value)
            return frozenset(result)
        return EMPTY


# --------------------------------------------------------------------------------- the pass
def dotted(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _target_names(target: cst.BaseExpression) -> List[cst.Name]:
    """Names bound by an assignment target (`a`, `a, (b, *c)`), not `x.y` or `x[i]`."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        names: List[cst.Name] = []
        for element in target.elements:
            names.extend(_target_names(element.value))
        return names
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


class _Indexer(cst.CSTVisitor):
    def __init__(self, index: NameIndex) -> None:
        super().__init__()
        self.ix = index
        self.stack: List[cst.CSTNode] = []
        self.scopes: List[Scope] = [index.module_scope]
        self.not_loads: Set[cst.Name] = set()
        self.skip_names = 0  # > 0 inside import / global / nonlocal / del statements
        self.param_scopes: Dict[cst.Parameters, Scope] = {}
        self.visitor_hooks: Dict[type, Tuple[object, object]] = {}

    def run(self, module: cst.Module) -> None:
        """`cst_walk.walk(module, self)`, with what an `on_visit` / `on_leave` pair would do
        inlined in the walk: this runs for every node of every file LibCST parses."""
        self._walk(module)

    # The stack gives every node its parent; `scope_entries` switches scope at block boundaries.
    def _walk(self, node: cst.CSTNode) -> None:
        kind = type(node)
        found = self.visitor_hooks.get(kind)
        if found is None:  # CSTVisitor.on_visit / on_leave, without their per-node lookups
            found = self.visitor_hooks[kind] = hooks(type(self), kind)
        visit, leave = found
        stack = self.stack
        if stack:
            self.ix.parents[node] = stack[-1]
        stack.append(node)
        scopes = self.scopes
        # The scopes this node enters: its block's (a def's body), and a comprehension's, which its
        # hook pushes itself; a comprehension that is another's first iterable enters both.
        depth = len(scopes)
        scope = self.ix.scope_entries.get(node)
        if scope is not None:
            scopes.append(scope)
        descend = visit is None or visit(self, node) is not False
        if descend:
            kinds = KINDS
            # cst_walk._walk's loop over the children, inline (a call per node costs 10% of this pass)
            for name in field_order(node):
                value = getattr(node, name)
                value_kind = kinds.get(type(value))
                if value_kind is None:
                    value_kind = kind_of(type(value))
                if value_kind == NODE:
                    self._walk(value)
                elif value_kind == SEQUENCE:
                    for item in value:
                        item_kind = kinds.get(type(item))
                        if item_kind is None:
                            item_kind = kind_of(type(item))
                        if item_kind == NODE:
                            self._walk(item)
        if leave is not None:
            leave(self, node)
        if len(scopes) > depth:
            for scope in scopes[depth:]:
                if scope.global_names or scope.nonlocal_names:
                    self._rebind_declared(scope)
            del scopes[depth:]
        stack.pop()

    def _rebind_declared(self, scope: Scope) -> None:
        """A `global`/`nonlocal` declaration holds for the whole function, also for a name it
        bound before the declaration (`from apex import amp` then `global amp` in a method, which
        CPython accepts for imports): move such bindings where `_bind` would have put them."""
        for name in [n for n in scope.bindings if n in scope.global_names or n in scope.nonlocal_names]:
            moved = scope.bindings.pop(name)
            for binding in moved:
                self._bind(scope, name, binding)

    @property
    def scope(self) -> Scope:
        return self.scopes[-1]

    def _statement(self) -> Optional[cst.CSTNode]:
        for node in reversed(self.stack):
            if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return node
        return None

    def _new_scope(self, kind: str, node: cst.CSTNode) -> Scope:
        scope = Scope(kind, node, self.scope)
        self.ix.scopes.append(scope)
        return scope

    def _bind(self, scope: Scope, name: str, binding: Binding) -> None:
        if name in scope.global_names:
            scope = self.ix.module_scope
        elif name in scope.nonlocal_names:
            outer = scope.parent
            while outer is not None and (outer.kind == "class" or name not in outer.bindings):
                outer = outer.parent
            scope = outer if outer is not None else scope
        binding.scope = scope
        scope.bindings.setdefault(name, []).append(binding)

    def _bind_target(self, target, kind, value=None, annotation=None) -> None:
        self._mark_attribute_stores(target)
        names = _target_names(target)
        simple = isinstance(target, cst.Name)
        values: Dict[cst.Name, Optional[cst.BaseExpression]] = {}
        if simple:
            values[target] = value
        elif (
            isinstance(target, cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
            and all(isinstance(e, cst.Element) for e in (*target.elements, *value.elements))
        ):
            # a, b = x, y: pair each name with its value.
            for t_el, v_el in zip(target.elements, value.elements):
                if isinstance(t_el.value, cst.Name):
                    values[t_el.value] = v_el.value
        for name in names:
            self.not_loads.add(name)
            binding = Binding(
                name.value,
                kind,
                self.scope,
                name,
                self._statement(),
                value=values.get(name),
                annotation=annotation,
            )
            self._bind(self.scope, name.value, binding)
        self._record_self_attribute(target, value, annotation)

    def _mark_attribute_stores(self, target) -> None:
        if isinstance(target, cst.Attribute):
            self.ix.store_attributes.add(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._mark_attribute_stores(element.value)
        elif isinstance(target, cst.StarredElement):
            self._mark_attribute_stores(target.value)

    def _record_self_attribute(self, target, value, annotation) -> None:
        """`self.x = value` in a method, or `x: T` in a class body, feeds `self.x` lookups."""
        scope = self.scope
        if (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and scope.kind == "function"
            and scope.parent is not None
            and scope.parent.kind == "class"
        ):
            func = scope.node
            params = func.params.params if isinstance(func, cst.FunctionDef) else ()
            if params and params[0].name.value == target.value.value:
                binding = Binding(
                    target.attr.value,
                    "assign" if value is not None else "annotation",
                    scope,
                    target,
                    self._statement(),
                    value=value,
                    annotation=annotation,
                )
                scope.parent.self_attrs.setdefault(target.attr.value, []).append(binding)
        elif isinstance(target, cst.Name) and scope.kind == "class":
            binding = Binding(
                target.value, "annotation", scope, target, self._statement(), value, annotation=annotation
            )
            scope.self_attrs.setdefault(target.value, []).append(binding)

    # ------------------------------------------------------------------ names that are not loads
    def visit_Name(self, node: cst.Name) -> None:
        if self.skip_names or node in self.not_loads:
            return
        self.ix.loads[node] = self.scope

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_loads.add(node.attr)
        if isinstance(node.value, cst.Name):
            self.ix.name_attributes.append(node)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_loads.add(node.keyword)

    # ------------------------------------------------------------------ imports
    def visit_Import(self, node: cst.Import) -> None:
        self.skip_names += 1
        for alias in node.names:
            imported = dotted(alias.name)
            if imported is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound, qname = alias.asname.name.value, imported
            else:
                bound = qname = imported.split(".")[0]
            self._bind(self.scope, bound, Binding(bound, "import", self.scope, alias, node, qname=qname))

    def leave_Import(self, original_node: cst.Import) -> None:
        self.skip_names -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.skip_names += 1
        module = dotted(node.module) if node.module is not None else None
        relative = bool(node.relative)
        if isinstance(node.names, cst.ImportStar):
            self.ix.has_star_import = True
            if module is not None and not relative and module in STAR_EXPORTS:
                self.ix.star_imports.append((self.scope, module))
            return
        for alias in node.names:
            if not isinstance(alias.name, cst.Name):
                continue
            imported = alias.name.value
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound = alias.asname.name.value
            else:
                bound = imported
            qname = None if relative or module is None else f"{module}.{imported}"
            self._bind(self.scope, bound, Binding(bound, "from-import", self.scope, alias, node, qname=qname))

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self.skip_names -= 1

    def visit_Global(self, node: cst.Global) -> None:
        self.skip_names += 1
        self.scope.global_names.update(item.name.value for item in node.names)

    def leave_Global(self, original_node: cst.Global) -> None:
        self.skip_names -= 1

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.skip_names += 1
        self.scope.nonlocal_names.update(item.name.value for item in node.names)

    def leave_Nonlocal(self, original_node: cst.Nonlocal) -> None:
        self.skip_names -= 1

    def visit_Del(self, node: cst.Del) -> None:
        self.skip_names += 1

    def leave_Del(self, original_node: cst.Del) -> None:
        self.skip_names -= 1

    # ------------------------------------------------------------------ assignments
    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind_target(target.target, "assign", node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        kind = "assign" if node.value is not None else "annotation"
        self._bind_target(node.target, kind, node.value, node.annotation.annotation)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._mark_attribute_stores(node.target)
        if isinstance(node.target, cst.Name):
            binding = Binding(node.target.value, "augassign", self.scope, node.target, node)
            self._bind(self.scope, node.target.value, binding)
            # The target is also read; it stays a load.

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, "for")

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, "with", node.item)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None and isinstance(node.name.name, cst.Name):
            self._bind_target(node.name.name, "except")

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        scope = self.scope
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        if isinstance(node.target, cst.Name):
            self.not_loads.add(node.target)
            binding = Binding(node.target.value, "walrus", scope, node.target, self._statement(), node.value)
            self._bind(scope, node.target.value, binding)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self._bind_target(node.name, "match")

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self._bind_target(node.name, "match")

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self._bind_target(node.rest, "match")

    # ------------------------------------------------------------------ scopes
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.not_loads.add(node.name)
        self._bind(self.scope, node.name.value, Binding(node.name.value, "def", self.scope, node, node))
        scope = self._new_scope("function", node)
        self.ix.scope_entries[node.body] = scope
        self.param_scopes[node.params] = scope

    def visit_Lambda(self, node: cst.Lambda) -> None:
        scope = self._new_scope("lambda", node)
        self.ix.scope_entries[node.body] = scope
        self.param_scopes[node.params] = scope

    def visit_Param(self, node: cst.Param) -> None:
        self.not_loads.add(node.name)
        scope = self.param_scopes.get(self.stack[-2]) if len(self.stack) > 1 else None
        if scope is None:
            return
        annotation = node.annotation.annotation if node.annotation is not None else None
        binding = Binding(node.name.value, "param", scope, node.name, scope.node, annotation=annotation)
        self._bind(scope, node.name.value, binding)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.not_loads.add(node.name)
        self._bind(self.scope, node.name.value, Binding(node.name.value, "class", self.scope, node, node))
        self.ix.scope_entries[node.body] = self._new_scope("class", node)

    def _enter_comprehension(self, node) -> None:
        outer = self.scope
        scope = self._new_scope("comprehension", node)
        # The first iterable is evaluated in the enclosing scope; everything else inside.
        self.ix.scope_entries[node.for_in.iter] = outer
        self.ix.scope_entries[node] = scope
        self.scopes.append(scope)

    visit_ListComp = _enter_comprehension
    visit_SetComp = _enter_comprehension
    visit_DictComp = _enter_comprehension
    visit_GeneratorExp = _enter_comprehension

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_target(node.target, "for")
