"""apex.amp set up by a base class of one file for subclasses in other files: the index facts and
the one decision.

The shape (a trainer or runner base class, segmentationPytorch's runner/base.py with
runner/runner.py): file A defines `class BaseModel:` whose `__init__` runs `self.network,
self.optimizer = amp.initialize(self.network, self.optimizer, opt_level="O1")` (maybe under
`if self.args.fp16:`) and scales no loss; file B imports the class by name (`from runner.base
import BaseModel`) and a method of `class SegmentationModel(BaseModel):` runs `with
amp.scale_loss(loss, self.optimizer) as s: s.backward()` and `self.optimizer.step()`.

The migration is the one-file migration of a base class and its subclasses
(rules/apex/_scaler_access.py `_inherits_setup`) across files: A's `__init__` creates
`self.<scaler>` where `initialize` was (before its `if`s, `enabled=` their condition) and B's
methods read it, autocast enabled as the scaler is (rules/apex/_base_class.py). Both sides ask
`decide_base` with the same index and get the same answer: the A record and every subclass record
must have no problem, and no other file of the run that imports A or a subclass file may scale a
loss with apex without setting it up (it would lose the `amp.initialize` it relied on). The facts
are read with `ast` and are a conservative picture of what the planners take.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ampmigrate.engine.apex_attrs import imports_apex_amp
from ampmigrate.engine.apex_threading import _INIT_KEYWORDS, _SAFE_LEVELS, SCALER_NAMES, _own_nodes, _parent_call
from ampmigrate.engine.apex_trainer_class import _self_attribute
from ampmigrate.engine.caller_uses import importers_through_relays, relayed_by, source_tree
from ampmigrate.engine.import_resolution import resolve

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ModuleSummary, ProjectIndex


# ---------------------------------------------------------------------------------- facts
def _method_of(tree: ast.Module, node: ast.AST) -> Tuple[Optional[ast.ClassDef], Optional[ast.FunctionDef]]:
    """(the top-level class, its method) whose own body holds `node` (not a nested function's)."""
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for method in cls.body:
            if isinstance(method, ast.FunctionDef) and any(inner is node for inner in _own_nodes(method)):
                return cls, method
    return None, None


def setup_class(tree: ast.Module, summary: "ModuleSummary", init: ast.Attribute, uses: List[ast.Attribute]) -> None:
    """A side: the file's one `amp.initialize` is in a method of a top-level class (`__init__`, or
    another method beside an `__init__` of the class's own, which then makes a disabled scaler for
    the instances that never call it) and binds two attributes of the instance; the record is (the
    model attribute, the optimizer attribute, why the migration cannot take it or "")."""
    cls, method = _method_of(tree, init)
    if cls is None or method is None or sum(n.attr in ("initialize", "init") for n in uses) != 1:
        return
    instance = method.args.args[0].arg if method.args.args else ""
    call = _parent_call(method, init)
    assign = next((s for s in ast.walk(method) if isinstance(s, ast.Assign) and call is not None and s.value is call), None)
    target = assign.targets[0] if assign is not None and len(assign.targets) == 1 else None
    attributes = [_self_attribute(e, instance) for e in target.elts] if isinstance(target, (ast.Tuple, ast.List)) else []
    if len(attributes) != 2 or None in attributes:
        summary.apex_setup_classes[cls.name] = (
            "", "", f"`amp.initialize` in `{cls.name}.{method.name}()` does not bind two attributes of `{instance or 'self'}`"
        )
        return
    model, optimizer = attributes
    problem = ""
    other = next((n.attr for n in uses if n is not init), None)
    if other is not None:
        problem = f"the file also uses `amp.{other}`"
    elif not all(map(registers_only, cls.decorator_list)) or cls.keywords or method.decorator_list:
        problem = f"`{cls.name}` or its `{method.name}()` is decorated or has a metaclass"
    elif method.name != "__init__" and not any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in cls.body):
        problem = f"`{cls.name}` sets apex up in `{method.name}()` and has no `__init__` of its own to make the scaler every instance reads"
    elif len(call.args) != 2 or any(isinstance(a, ast.Starred) for a in call.args):
        problem = "`amp.initialize` is not given one model and one optimizer"
    else:
        for keyword in call.keywords:
            if keyword.arg not in _INIT_KEYWORDS:
                problem = f"`amp.initialize` is given `{keyword.arg or '**'}`, which apex's signature does not have"
            elif keyword.arg == "opt_level" and isinstance(keyword.value, ast.Constant) and keyword.value.value not in _SAFE_LEVELS:
                problem = f"`opt_level={keyword.value.value!r}` is not O0, O1 or O2"
    summary.apex_setup_classes[cls.name] = (model, optimizer, problem)


def subclass_steps(
    tree: ast.Module, uses: List[ast.Attribute], scales: List[ast.Attribute], module_level_import: bool
) -> Tuple[Dict[str, Tuple[str, str, str, str]], List[ast.Attribute]]:
    """B side: of the `amp.scale_loss` uses in methods of top-level classes (`scales`), those of a
    class deriving from one class imported by name (`from m import Base`) that never stores the
    optimizer it scales with (so the base set it up): ({class: (the module as imported, the base's
    name there, the optimizer attribute, why not or "")}, the uses left to the other shapes)."""
    imported = _from_imported(tree)
    by_class: Dict[str, Tuple[ast.ClassDef, List[Tuple[ast.FunctionDef, ast.Attribute]]]] = {}
    for node in scales:
        cls, method = _method_of(tree, node)
        if cls is not None:
            by_class.setdefault(cls.name, (cls, []))[1].append((method, node))
    records: Dict[str, Tuple[str, str, str, str]] = {}
    taken: Set[int] = set()
    for name, (cls, found) in by_class.items():
        if len(cls.bases) != 1 or not isinstance(cls.bases[0], ast.Name) or cls.bases[0].id not in imported:
            continue
        module, base = imported[cls.bases[0].id]
        optimizers = set()
        for method, node in found:
            call = _parent_call(method, node)
            given = None
            if call is not None:
                given = call.args[1] if len(call.args) >= 2 else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
            instance = method.args.args[0].arg if method.args.args else ""
            optimizers.add(_self_attribute(given, instance))
        if len(optimizers) != 1 or None in optimizers:
            continue
        (optimizer,) = optimizers
        if any(isinstance(n, ast.Attribute) and n.attr == optimizer and not isinstance(n.ctx, ast.Load) for n in ast.walk(cls)):
            continue  # the class sets its optimizer itself: the trainer class's shape (engine/apex_trainer_class.py)
        problem = _subclass_problem(tree, cls, found, uses, optimizer, module_level_import)
        records[name] = (module, base, optimizer, problem)
        taken.update(id(node) for _, node in found)
    return records, [n for n in scales if id(n) not in taken]


# A registry's decorator (fvcore's and detectron2's `REGISTRY.register()`, mmcv's
# `MODELS.register_module()`) records the class and hands the same class back.
_REGISTERING = frozenset({"register", "register_module"})


def registers_only(decorator: ast.expr) -> bool:
    """`@<registry>.register()` / `.register_module(...)` / `.register`: the class stays itself."""
    func = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(func, ast.Attribute) and func.attr in _REGISTERING and isinstance(func.value, (ast.Name, ast.Attribute))


def _from_imported(tree: ast.Module) -> Dict[str, Tuple[str, str]]:
    """{name: (module as written with its dots, name there)} for names the module binds once, at
    its top level, by `from m import name [as alias]` and nowhere else."""
    found: Dict[str, Tuple[str, str]] = {}
    counts: Dict[str, int] = {}
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if alias.name == "*":
                    continue
                local = alias.asname or alias.name
                found[local] = ("." * statement.level + (statement.module or ""), alias.name)
    for node in ast.walk(tree):
        bound = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound = [node.id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [(a.asname or a.name).partition(".")[0] for a in node.names]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound = list(node.names)
        for name in bound:
            counts[name] = counts.get(name, 0) + 1
    return {name: where for name, where in found.items() if counts.get(name) == 1}


def _subclass_problem(tree, cls: ast.ClassDef, found, uses, optimizer: str, module_level_import: bool) -> str:
    from ampmigrate.engine.apex_threading import scaled_with_problem

    inside = {id(n) for n in ast.walk(cls)}
    stray = sorted({n.attr for n in uses if n.attr != "scale_loss" and not (n.attr == "master_params" and id(n) in inside)})
    if stray:
        return f"the file also uses `amp.{stray[0]}`, which the split migration does not rewrite"
    if not all(map(registers_only, cls.decorator_list)) or cls.keywords:
        return f"`{cls.name}` has a metaclass or decorators"
    base = cls.bases[0].id
    for statement in cls.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name in ("__new__", "__setattr__", "__getattribute__"):
            return f"`{cls.name}` defines `{statement.name}`"
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and "__slots__" in ast.dump(statement):
            return f"`{cls.name}` declares `__slots__`"
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is not None and not _starts_with_base_init(init, cls.name, base):
        return (
            f"`{cls.name}.__init__` does not start by running `{base}.__init__`, so its instances may not get the "
            "scaler the base class makes"
        )
    for method, node in found:
        instance = method.args.args[0].arg if method.args.args else None
        if method.decorator_list or instance is None:
            return f"`{cls.name}.{method.name}()` is not a plain method"
        if not (module_level_import or any(imports_apex_amp(n) for n in ast.walk(method))):
            return f"apex's amp is not imported at the top of this file nor in `{cls.name}.{method.name}()`"
        call = _parent_call(method, node)
        problem = scaled_with_problem(method, call)
        if problem:
            return problem
        if not any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
            and _self_attribute(n.func.value, instance) == optimizer
            for n in ast.walk(method)
        ):
            return f"`{instance}.{optimizer}.step()` is not called in `{cls.name}.{method.name}()`"
        if not any(isinstance(n, ast.Call) and n.lineno < call.lineno for n in ast.walk(method) if n is not call):
            return "no call (the forward pass) comes before the loss is scaled"
    for method in (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.args.args):
        instance = method.args.args[0].arg
        if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr", "vars")
            and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == instance
            for n in ast.walk(method)
        ):
            return f"`{cls.name}.{method.name}()` sets attributes of `{instance}` through `setattr`/`vars`"
    return ""


def _starts_with_base_init(init: ast.FunctionDef, cls_name: str, base: str) -> bool:
    """`super().__init__(...)`, `super(Cls, self).__init__(...)` or `Base.__init__(self, ...)` as
    the first statement (after a docstring)."""
    body = list(init.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Call):
        return False
    func = body[0].value.func
    if not (isinstance(func, ast.Attribute) and func.attr == "__init__"):
        return False
    owner = func.value
    if isinstance(owner, ast.Name):
        return owner.id == base
    if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
        return not owner.args or (
            len(owner.args) == 2 and isinstance(owner.args[0], ast.Name) and owner.args[0].id == cls_name
        )
    return False


# ---------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class BaseDecision:
    migrate: bool
    reason: str = ""  # why not, when not
    scaler: str = ""  # the attribute the base's `__init__` sets, the subclasses read
    model: str = ""  # the model attribute `amp.initialize` bound (a forward pass's callee in the subclasses)
    members: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (subclass file, its classes of the group)


def setup_of(index: "ProjectIndex", path: str, cls: str) -> Optional[Tuple[str, str]]:
    """(the file, the class) that a subclass record of the file at `path` names as its base, when
    that is a setup class of a file of the run."""
    absolute = os.path.abspath(path)
    record = index.modules[absolute].apex_subclass_steps.get(cls) if absolute in index.modules else None
    if record is None:
        return None
    module, base = record[0], record[1]
    other = resolve(index, absolute, module)
    if other is None:
        return None
    if base in index.modules[other].apex_setup_classes:
        return other, base
    # `from engine import Engine` where `engine/__init__.py` re-exports it from `engine/base.py`.
    for setup, summary in index.modules.items():
        if base in summary.apex_setup_classes and other in relayed_by(index, setup, base):
            return setup, base
    return None


def subclassed_elsewhere(index: "ProjectIndex", path: str, cls: str) -> bool:
    """Some file of the run records a subclass scaling a loss whose base is `cls` of `path`."""
    absolute = os.path.abspath(path)
    return any(
        setup_of(index, other, name) == (absolute, cls)
        for other, _, _ in importers_through_relays(index, absolute, [cls])
        for name in index.modules[other].apex_subclass_steps
    )


def decide_base(index: "ProjectIndex", path: str, cls: str) -> BaseDecision:
    """Whether the setup class `cls` of the file at `path` (A) and its subclasses in the other files
    of the run migrate together. Memoized per index: every side asks the same question."""
    memo = index.__dict__.setdefault("_apex_base_decisions", {})
    key = (os.path.abspath(path), cls)
    if key not in memo:
        memo[key] = _decide(index, *key)
    return memo[key]


def _decide(index: "ProjectIndex", absolute: str, cls: str) -> BaseDecision:
    here = index.relative(absolute)
    record = index.modules[absolute].apex_setup_classes.get(cls)
    if record is None:
        return BaseDecision(False, f"`{cls}` of {here} does not set apex up in its `__init__`")
    model, optimizer, problem = record
    if problem:
        return BaseDecision(False, f"in {here}: {problem}")
    members: List[Tuple[str, Tuple[str, ...]]] = []
    readers: List[str] = [absolute]
    relays = relayed_by(index, absolute, cls)
    for other, how, source in importers_through_relays(index, absolute, [cls]):
        where = index.relative(other)
        if how.ambiguity(cls):
            return BaseDecision(
                False, f"{where} imports `{how.ambiguity(cls)}`, which may be {index.relative(source)} or another file of the run"
            )
        if other in relays:
            continue  # a package re-exporting the class: its importers are read in its place
        facts = index.modules[other]
        readers.append(other)
        mine = [name for name in facts.apex_subclass_steps if setup_of(index, other, name) == (absolute, cls)]
        scales = bool(facts.apex_subclass_steps or facts.apex_step_functions)
        if not scales:
            continue
        if facts.apex_step_functions or len(mine) != len(facts.apex_subclass_steps):
            return BaseDecision(
                False, f"{where} imports {here} and scales a loss with apex's amp elsewhere than in a subclass of `{cls}`"
            )
        for name in mine:
            _, _, scaled, sub_problem = facts.apex_subclass_steps[name]
            if sub_problem:
                return BaseDecision(False, f"in {where}: {sub_problem}")
            if scaled != optimizer:
                return BaseDecision(
                    False, f"`{name}` in {where} scales with `self.{scaled}`, not `self.{optimizer}`, which `{cls}` set up"
                )
        members.append((other, tuple(mine)))
    if not members:
        return BaseDecision(False, f"no file of the run scales a loss in a subclass of `{cls}` ({here})")
    # A file importing a subclass file may subclass again and scale there (its base is no setup class).
    for member, classes in members:
        for other, _how, _source in importers_through_relays(index, member, list(classes)):
            facts = index.modules[other]
            readers.append(other)
            if other != absolute and (facts.apex_subclass_steps or facts.apex_step_functions) and other not in dict(members):
                return BaseDecision(
                    False, f"{index.relative(other)} imports {index.relative(member)} and scales a loss with apex's amp "
                    "without setting it up"
                )
    from ampmigrate.engine.apex_owned_optimizer import _subclass_skipping_init

    names = {cls, *(c for _, classes in members for c in classes)}
    skipping = _subclass_skipping_init(index, [absolute, *(m for m, _ in members)], names)
    if skipping and not (skipping[0] in dict(members) and skipping[1] in dict(members)[skipping[0]]):
        return BaseDecision(
            False, f"`{skipping[1]}` in {index.relative(skipping[0])} derives from `{cls}` or a subclass of it and does not "
            "start its `__init__` with its base's, so its instances would miss the scaler the base makes"
        )
    scaler = _free_name(index, readers)
    if not scaler:
        return BaseDecision(False, "every usual name for the scaler is an attribute name in these files")
    return BaseDecision(True, "", scaler, model, tuple(members))


def _free_name(index: "ProjectIndex", paths: List[str]) -> str:
    """The first usual scaler name no file of the group (and no file importing one) uses as an
    attribute or a name: the subclasses, and whatever else holds their instances, keep theirs."""
    used: Set[str] = set()
    for path in dict.fromkeys(paths):
        tree = source_tree(index, path)
        if tree is None:
            return ""
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Name):
                used.add(node.id)
    return next((name for name in SCALER_NAMES if name not in used), "")


def base_class_key(index: "ProjectIndex", path: str) -> str:
    """What of the index the migration of a setup class's file or a subclass file depends on ("" if
    the file is neither): every such file's facts and bytes, and those of the files importing them."""
    facts = index.modules.get(os.path.abspath(path))
    if facts is None or not (facts.apex_setup_classes or facts.apex_subclass_steps):
        return ""
    cached = getattr(index, "_base_class_digest", None)
    if cached is None:
        parts: List[str] = []
        involved = [p for p, s in sorted(index.modules.items()) if s.apex_setup_classes or s.apex_subclass_steps]
        for member in involved:
            summary = index.modules[member]
            parts.append(repr((member, _plain(summary.apex_setup_classes), _plain(summary.apex_subclass_steps),
                               index.digests.get(member))))
            for other in index.importers_of(member):
                parts.append(repr((member, other, index.digests.get(other))))
            classes = sorted({*summary.apex_setup_classes, *summary.apex_subclass_steps})
            for other, _, source in importers_through_relays(index, member, classes):
                if source != member:  # through a package re-exporting a class of the group
                    parts.append(repr((member, source, other, index.digests.get(other))))
        cached = hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()
        index._base_class_digest = cached
    return cached


def _plain(records: Dict[str, tuple]) -> List[Tuple[str, tuple]]:
    """Records as the key reads them, whether summarized now (tuples) or loaded from the cache (lists)."""
    return sorted((name, tuple(record)) for name, record in records.items())
