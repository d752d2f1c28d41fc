"""apex.amp set up by a script on an object whose class owns its optimizer: the index facts and the
one decision.

The shape (PLATO's run.py with plato/models/unified_transformer.py, SeqRegNet, Alaska2's Fitter):
class B builds `self.optimizer` in its own `__init__` and a method runs `with
amp.scale_loss(loss, self.optimizer) as s: s.backward()` then `self.optimizer.step()`; script A
makes an instance (often through a factory or registry the index cannot follow) and calls
`amp.initialize` on it: `model, optimizer = amp.initialize(model, model.optimizer)`, `regnet,
regnet.optimizer = amp.initialize(regnet, regnet.optimizer)`, `fitter.model, fitter.optimizer =
amp.initialize(fitter.model, fitter.optimizer)`.

The migration (rules/apex/_owned_optimizer.py): B's `__init__` makes a disabled
`self.<scaler>` first thing, and its methods read it (autocast enabled as it is); A replaces
`amp.initialize` with `<object>.<scaler> = torch.amp.GradScaler("cuda", enabled=...)`, where it
was. An instance no script sets up trains in fp32 (apex raised there: `amp.scale_loss` before
`amp.initialize`). The object's class is matched by the optimizer's attribute name, so the group
is every such script and class of the run: all migrate or none does, and a file of the run that
scales a loss with apex in any other shape without setting it up stops them all.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Set, Tuple

from ampmigrate.engine.apex_attrs import imports_apex_amp
from ampmigrate.engine.apex_threading import _INIT_KEYWORDS, _SAFE_LEVELS, _parent_call
from ampmigrate.engine.apex_base_class import _free_name, _plain
from ampmigrate.engine.caller_uses import source_tree

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ModuleSummary, ProjectIndex


# ---------------------------------------------------------------------------------- facts
def instance_setup(tree: ast.Module, summary: "ModuleSummary", init: ast.Attribute, uses: List[ast.Attribute]) -> None:
    """A side: the file's one `amp.initialize` is given `<name>.<attribute>` as the optimizer
    (`amp.initialize(model, model.optimizer)`); the record is (the name, the attribute, why not or "")."""
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func is init), None)
    if call is None or sum(n.attr in ("initialize", "init") for n in uses) != 1:
        return
    given = call.args[1] if len(call.args) >= 2 else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
    if not (isinstance(given, ast.Attribute) and isinstance(given.value, ast.Name)):
        return
    owner, attribute = given.value.id, given.attr
    problem = ""
    other = next((n.attr for n in uses if n is not init), None)
    if other is not None:
        problem = f"the file also uses `amp.{other}`"
    elif any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        problem = "`amp.initialize` unpacks its arguments"
    else:
        for keyword in call.keywords:
            if keyword.arg not in _INIT_KEYWORDS and keyword.arg not in ("models", "optimizers"):
                problem = f"`amp.initialize` is given `{keyword.arg}`, which apex's signature does not have"
            elif keyword.arg == "opt_level" and isinstance(keyword.value, ast.Constant) and keyword.value.value not in _SAFE_LEVELS:
                problem = f"`opt_level={keyword.value.value!r}` is not O0, O1 or O2"
    summary.apex_instance_setups.append((owner, attribute, problem))


def owned_optimizer_classes(
    tree: ast.Module, uses: List[ast.Attribute], scales: List[ast.Attribute], module_level_import: bool
) -> Tuple[Dict[str, Tuple[str, str]], List[ast.Attribute]]:
    """B side: of the `amp.scale_loss` uses in methods of top-level classes (`scales`), those of a
    class that builds the optimizer it scales with in its own `__init__`, by a call (`self.optimizer
    = torch.optim.Adam(...)`; a parameter or a local stored there is the trainer class's shape or a
    setup helper's): ({class: (the optimizer attribute, why not or "")}, the uses left to the other
    shapes)."""
    from ampmigrate.engine.apex_base_class import _method_of
    from ampmigrate.engine.apex_threading import scaled_with_problem

    by_class: Dict[str, Tuple[ast.ClassDef, List[Tuple[ast.FunctionDef, ast.Attribute]]]] = {}
    for node in scales:
        cls, method = _method_of(tree, node)
        if cls is not None:
            by_class.setdefault(cls.name, (cls, []))[1].append((method, node))
    records: Dict[str, Tuple[str, str]] = {}
    taken: Set[int] = set()
    for name, (cls, found) in by_class.items():
        optimizers = set()
        for method, node in found:
            call = _parent_call(method, node)
            given = None
            if call is not None:
                given = call.args[1] if len(call.args) >= 2 else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
            instance = method.args.args[0].arg if method.args.args else ""
            optimizers.add(given.attr if isinstance(given, ast.Attribute) and isinstance(given.value, ast.Name) and given.value.id == instance else None)
        if len(optimizers) != 1 or None in optimizers:
            continue
        (optimizer,) = optimizers
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is None or not init.args.args:
            continue
        builds = [
            s for s in init.body
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute)
            and s.targets[0].attr == optimizer and isinstance(s.targets[0].value, ast.Name)
            and s.targets[0].value.id == init.args.args[0].arg
        ]
        if len(builds) != 1 or not isinstance(builds[0].value, ast.Call):
            continue  # handed in (the trainer class's shape), taken from a local or built more than once
        problem = ""
        inside = {id(n) for n in ast.walk(cls)}
        # the class's own checkpoint (`'amp': amp.state_dict()` in its `save()`) becomes the scaler's
        kept = ("master_params", "state_dict", "load_state_dict")
        stray = sorted({n.attr for n in uses if n.attr != "scale_loss" and not (n.attr in kept and id(n) in inside)})
        stores = [n for n in ast.walk(cls) if isinstance(n, ast.Attribute) and n.attr == optimizer and not isinstance(n.ctx, ast.Load)]
        if stray:
            problem = f"the file also uses `amp.{stray[0]}`, which the split migration does not rewrite"
        elif cls.decorator_list or cls.keywords or init.decorator_list:
            problem = f"`{cls.name}` or its `__init__` is decorated or has a metaclass"
        elif len(stores) != 1:
            problem = f"`{cls.name}` sets `self.{optimizer}` elsewhere than once in `__init__`"
        for method, node in found if not problem else ():
            instance = method.args.args[0].arg if method.args.args else None
            if method.decorator_list or instance is None:
                problem = f"`{cls.name}.{method.name}()` is not a plain method"
            elif not (module_level_import or any(imports_apex_amp(n) for n in ast.walk(method))):
                problem = f"apex's amp is not imported at the top of this file nor in `{cls.name}.{method.name}()`"
            else:
                call = _parent_call(method, node)
                problem = scaled_with_problem(method, call)
                if not problem and not any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
                    and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == optimizer
                    for n in ast.walk(method)
                ):
                    problem = f"`{instance}.{optimizer}.step()` is not called in `{cls.name}.{method.name}()`"
            if problem:
                break
        records[name] = (optimizer, problem)
        taken.update(id(node) for _, node in found)
    return records, [n for n in scales if id(n) not in taken]


# ---------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class OwnedDecision:
    migrate: bool
    reason: str = ""
    scaler: str = ""  # the attribute the classes make and the scripts set
    scripts: Tuple[str, ...] = ()  # absolute paths
    classes: Tuple[Tuple[str, str], ...] = ()  # (absolute path, class)


def decide_owned(index: "ProjectIndex", attribute: str) -> OwnedDecision:
    """Whether every script setting apex up on `<x>.<attribute>` and every class owning its
    optimizer as `self.<attribute>` migrate together. Memoized per index."""
    memo = index.__dict__.setdefault("_apex_owned_decisions", {})
    if attribute not in memo:
        memo[attribute] = _decide(index, attribute)
    return memo[attribute]


def _decide(index: "ProjectIndex", attribute: str) -> OwnedDecision:
    scripts: List[str] = []
    classes: List[Tuple[str, str]] = []
    for path, facts in sorted(index.modules.items()):
        where = index.relative(path)
        for owner, attr, problem in facts.apex_instance_setups:
            if attr == attribute:
                if problem:
                    return OwnedDecision(False, f"in {where}: {problem}")
                scripts.append(path)
        for name, (attr, problem) in facts.apex_owned_optimizers.items():
            if attr == attribute:
                if problem:
                    return OwnedDecision(False, f"in {where}: {problem}")
                classes.append((path, name))
        if facts.apex_step_functions or facts.apex_subclass_steps:
            return OwnedDecision(
                False, f"{where} scales a loss with apex's amp without setting it up, so which object `amp.initialize` "
                "set up for it cannot be told"
            )
        others = {a for a, _ in facts.apex_owned_optimizers.values()} - {attribute}
        if others:
            return OwnedDecision(False, f"{where} also has a class scaling with `self.{sorted(others)[0]}`")
    if not scripts:
        return OwnedDecision(False, f"no file of the run calls `amp.initialize` on an object's `.{attribute}`")
    if not classes:
        return OwnedDecision(False, f"no class of the run builds `self.{attribute}` and scales a loss with it")
    group = list(dict.fromkeys([*scripts, *(p for p, _ in classes)]))
    readers = list(group)
    for member in group:
        readers.extend(index.importers_of(member))
    skipping = _subclass_skipping_init(index, [p for p, _ in classes], {c for _, c in classes})
    if skipping:
        return OwnedDecision(
            False, f"`{skipping[1]}` in {index.relative(skipping[0])} derives from a class owning its optimizer and does "
            "not start its `__init__` with its base's, so its instances would miss the scaler the base makes"
        )
    scaler = _free_name(index, readers)
    if not scaler:
        return OwnedDecision(False, "every usual name for the scaler is an attribute name in these files")
    return OwnedDecision(True, "", scaler, tuple(scripts), tuple(classes))


def _subclass_skipping_init(index: "ProjectIndex", paths: List[str], names: Set[str]):
    """(file, class) of a class of those files or of a file importing them that names one of the
    owning classes as a base (by its last name: a conservative match) and has an `__init__` that
    does not start with its base's; None when there is none."""
    from ampmigrate.engine.apex_base_class import _starts_with_base_init

    seen: Set[str] = set()
    for path in paths:
        for other in (path, *index.importers_of(path)):
            if other in seen:
                continue
            seen.add(other)
            tree = source_tree(index, other)
            if tree is None:
                return other, "?"
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                base = next((b for b in bases if b in names), None)
                init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
                if base is not None and init is not None and not _starts_with_base_init(init, node.name, base):
                    return other, node.name
    return None


def owned_key(index: "ProjectIndex", path: str) -> str:
    """The cache-key part of a script's or an owning class's file: every such file's facts and
    bytes, and every file that scales a loss with apex without setting it up."""
    facts = index.modules.get(os.path.abspath(path))
    if facts is None or not (facts.apex_instance_setups or facts.apex_owned_optimizers):
        return ""
    cached = getattr(index, "_owned_digest", None)
    if cached is None:
        parts = []
        for member, summary in sorted(index.modules.items()):
            if summary.apex_instance_setups or summary.apex_owned_optimizers or summary.apex_step_functions or summary.apex_subclass_steps:
                parts.append(repr((member, [tuple(r) for r in summary.apex_instance_setups], _plain(summary.apex_owned_optimizers),
                                   index.digests.get(member))))
                for other in index.importers_of(member):
                    parts.append(repr((member, other, index.digests.get(other))))
        cached = hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()
        index._owned_digest = cached
    return cached
