"""apex.amp split across two files, the training step in a trainer *class*: the index facts.

The shape (lonePatient's run_bert.py + pybert/train/trainer.py, FARM's Trainer): file A calls
`model, optimizer = amp.initialize(...)` in a function and then constructs `Trainer(model,
optimizer, ...)` imported by name from B; B's `Trainer.__init__` stores the optimizer
(`self.optimizer = optimizer`) and a method runs `with amp.scale_loss(loss, self.optimizer) as
s: s.backward()` then `self.optimizer.step()`.

The class is recorded in `apex_step_functions` under its name like a step function (engine/
apex_threading.py), with `__init__`'s parameters (less `self`) and the one holding the optimizer,
so `decide` follows its constructions as it follows calls: every file importing it by name must
call `amp.initialize` and construct it only after that, with that optimizer, in that parameter.
The migration (rules/apex/_cross_threading.py with `_checkpoint_threading._HelperAccess`): the
constructor takes the GradScaler as a new parameter, stored first thing as `self.scaler`, which
the step method reads. Whatever the facts cannot follow refuses with its reason: a subclass or a
class with bases (its construction goes elsewhere), the optimizer attribute set anywhere else, a
local apex import the method does not see, the class used in its own file.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from ampmigrate.engine.apex_checkpoint import _class_record, class_init, name_loads, state_class
from ampmigrate.engine.apex_attrs import imports_apex_amp
from ampmigrate.engine.apex_threading import _own_nodes, _parent_call, scaled_with_problem


def step_classes(
    tree: ast.Module, uses: List[ast.Attribute], scaler: str, module_level_import: bool
) -> Tuple[Dict[str, Tuple[List[str], str, str, str]], List[ast.Attribute]]:
    """({class name: (`__init__`'s parameters less self, the one holding the optimizer, the
    scaler's name, why not)}, the `amp.scale_loss` uses in no method of a top-level class)."""
    scales = [n for n in uses if n.attr == "scale_loss"]
    by_class: Dict[str, Tuple[ast.ClassDef, List[ast.Attribute]]] = {}
    outside: List[ast.Attribute] = []
    for node in scales:
        cls = state_class(tree, node)
        if cls is None:
            outside.append(node)
        else:
            by_class.setdefault(cls.name, (cls, []))[1].append(node)
    if not by_class:
        return {}, outside
    loads = name_loads(tree)
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    records: Dict[str, Tuple[List[str], str, str, str]] = {}
    for name, (cls, nodes) in by_class.items():
        params, _, problem = _class_record(cls, loads, scaler, attributes, {id(n) for n in uses})
        optimizer = ""
        if not problem:
            problem, optimizer = _class_problem(tree, cls, nodes, uses, module_level_import)
        records[name] = (params, optimizer if not problem else "", scaler, problem)
    return records, outside


def _self_attribute(node: Optional[ast.AST], instance: str) -> Optional[str]:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == instance:
        return node.attr
    return None


def _class_problem(tree, cls: ast.ClassDef, scales, uses, module_level_import) -> Tuple[str, str]:
    """(why the trainer class cannot take the scaler, the `__init__` parameter of the optimizer)."""
    init = class_init(cls)
    assert init is not None  # _class_record said so
    methods = [s for s in cls.body if isinstance(s, ast.FunctionDef)]
    inside: Set[int] = {id(n) for m in methods for n in ast.walk(m)}
    stray = sorted({n.attr for n in uses if n.attr != "scale_loss" and not (n.attr == "master_params" and id(n) in inside)})
    if stray:
        return f"the file also uses `amp.{stray[0]}`, which the split migration does not rewrite", ""
    optimizer_attribute = ""
    for node in scales:
        method = next(m for m in methods if any(inner is node for inner in _own_nodes(m)))
        instance = method.args.args[0].arg
        local_import = any(imports_apex_amp(n) for n in ast.walk(method))
        if not (module_level_import or local_import):
            return (
                f"apex's amp is not imported at the top of this file nor in `{cls.name}.{method.name}()` "
                "(an import in another method does not reach it)"
            ), ""
        call = _parent_call(method, node)
        problem = scaled_with_problem(method, call)
        if problem:
            return problem, ""
        given = call.args[1] if len(call.args) >= 2 else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
        attribute = _self_attribute(given, instance)
        if attribute is None:
            return f"the optimizer passed to `amp.scale_loss` in `{cls.name}.{method.name}()` is not an attribute of `{instance}`", ""
        if optimizer_attribute and attribute != optimizer_attribute:
            return f"`{cls.name}` scales losses with two optimizers (`{optimizer_attribute}`, `{attribute}`)", ""
        optimizer_attribute = attribute
        if not any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
            and _self_attribute(n.func.value, instance) == attribute
            for n in ast.walk(method)
        ):
            return f"`{instance}.{attribute}.step()` is not called in `{cls.name}.{method.name}()`", ""
        if not any(isinstance(n, ast.Call) and n.lineno < call.lineno for n in ast.walk(method) if n is not call):
            return "no call (the forward pass) comes before the loss is scaled", ""
    # `self.<attribute> = <parameter>` in `__init__`, and nowhere else any store to `<x>.<attribute>`.
    init_self = init.args.args[0].arg
    params = [a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs]]
    sources = [
        s.value.id
        for s in init.body
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and _self_attribute(s.targets[0], init_self) == optimizer_attribute
        and isinstance(s.value, ast.Name)
    ]
    stores = [
        n for n in ast.walk(cls)
        if isinstance(n, ast.Attribute) and n.attr == optimizer_attribute and isinstance(n.ctx, (ast.Store, ast.Del))
    ]
    if len(sources) != 1 or len(stores) != 1 or sources[0] not in params:
        return (
            f"`{cls.name}` does not set `self.{optimizer_attribute}` once, in `__init__`, from a parameter "
            "(so the optimizer it scales with cannot be followed to its construction)"
        ), ""
    optimizer = sources[0]
    if any(isinstance(n, ast.Name) and n.id == optimizer and not isinstance(n.ctx, ast.Load) for n in ast.walk(init)):
        return f"`{optimizer}` is rebound in `{cls.name}.__init__()`", ""
    if any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr", "vars")
        for n in ast.walk(cls)
    ):
        return f"`{cls.name}` sets attributes through `setattr`/`vars`", ""
    return "", optimizer
