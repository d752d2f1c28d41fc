"""apex.amp checkpoint helpers in another file: the facts the project index keeps, and the decision.

The common shape (Swin-Transformer and its forks): `utils.py` has `try: from apex import amp
except ImportError: amp = None` and `load_checkpoint(config, model, optimizer, ...)` running
`amp.load_state_dict(checkpoint['amp'])`, `save_checkpoint(...)` running `save_state['amp'] =
amp.state_dict()`; `main.py` calls `amp.initialize` (its in-file migration creates the GradScaler)
and calls both helpers. The migration threads that scaler in: each helper takes a new `scaler`
parameter (`scaler.state_dict()`, the load guarded by GradScaler's layout), and every call of it
passes `scaler=<the scaler as the caller's plan spells it there>`
(rules/apex/_checkpoint_threading.py).

Both files are fixed by independent runs, so both decide from the same index facts with
`decide_state(index, path, function)`: the helper's file uses apex's amp only for
`amp.state_dict()` / `amp.load_state_dict(x)` (and tests of whether it imported), each such use in
a top-level function not called in its own file; every file of the run calling the helper, however
it spells it (`save_checkpoint(...)`, `utils.save_checkpoint(...)`, after `from utils import *`:
engine/caller_uses.py), calls `amp.initialize` itself and only calls the helper (never hands it,
or the module, on). A caller without `amp.initialize` makes both sides refuse, unless each of its
calls lacks a required argument (a `TypeError` before and after); so does an import that may be
the helper's file or another (engine/import_resolution.py), a re-export of the helper, and a
caller whose own plan stops (each side also plans the others from the bytes the index read).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ampmigrate.engine.apex_threading import SCALER_NAMES, _enclosing_top_function, _own_nodes, _params, apex_amp_tree
from ampmigrate.engine.caller_uses import binds, importers_through_relays, relayed_by, relays, signature, uses
from ampmigrate.engine.import_resolution import Importing
from ampmigrate.engine.import_resolution import key as resolution_key

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ModuleSummary, ProjectIndex

STATE_APIS = ("state_dict", "load_state_dict")


# ---------------------------------------------------------------------------------- facts
def summarize_checkpoint(tree: ast.Module, summary: "ModuleSummary") -> None:
    """Fill `apex_state_functions` (a helper's file) and `apex_initializes` /
    `apex_name_uses` (a caller's file) of one module."""
    tree, amp_names = apex_amp_tree(tree)  # `import apex`, then `apex.amp.initialize(...)` too
    if not amp_names:
        return
    uses = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in amp_names
    ]
    apis = {node.attr for node in uses}
    inits = [n for n in uses if n.attr in ("initialize", "init")]
    if inits:
        summary.apex_initializes = len(inits)
        summary.apex_inference_only = "scale_loss" not in apis and all(_inference_init(tree, n) for n in inits)
        imported = {  # local name -> the name imported (`from m import A as B`: B -> A)
            a.asname or a.name: a.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            for a in node.names
        }
        counts: Dict[str, List[int]] = {}
        calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in imported:
                entry = counts.setdefault(imported[node.id], [0, 0])
                entry[0 if id(node) in calls else 1] += 1
        summary.apex_name_uses = {name: (c, o) for name, (c, o) in sorted(counts.items())}
        return
    if not apis or not apis <= set(STATE_APIS):
        return
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    taken |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in [*n.posonlyargs, *n.args, *n.kwonlyargs]}
    scaler = next((name for name in SCALER_NAMES if name not in taken), "")
    loads = name_loads(tree)
    functions: Dict[str, Tuple[List[str], str, str]] = {}
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in uses:
        function = _enclosing_top_function(tree, node)
        if function is None:
            cls = state_class(tree, node)
            if cls is None:
                summary.apex_state_functions["<other>"] = ([], "", f"`amp.{node.attr}` is used outside a top-level function or a method")
                return
            if cls.name not in functions:
                functions[cls.name] = _class_record(cls, loads, scaler, attributes, {id(n) for n in uses})
            continue
        if function.name in functions:
            continue
        problem = ""
        if function.name in loads:
            problem = f"`{function.name}()` is also used in its own file, where no GradScaler is made"
        elif not scaler:
            problem = "every usual name for the scaler is taken in this file"
        elif function.args.vararg is not None or function.args.kwarg is not None:
            problem = f"`{function.name}()` takes `*args` or `**kwargs`"
        functions[function.name] = (_params(function), scaler, problem)
    summary.apex_state_functions.update(functions)
    saving = {id(_enclosing_top_function(tree, n)) for n in uses if n.attr != "load_state_dict"}
    summary.apex_state_loaders_only = sorted(
        f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in functions and id(f) not in saving
    )


def _inference_init(tree: ast.Module, attribute: ast.Attribute) -> bool:
    """`amp.initialize(model, opt_level=...)` (or `(model, None, ...)`, `optimizers=[]`): called,
    with a model and no optimizer."""
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func is attribute), None)
    if call is None or attribute.attr != "initialize" or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    keywords = {k.arg: k.value for k in call.keywords}
    if None in keywords:
        return False
    optimizers = call.args[1] if len(call.args) > 1 else keywords.get("optimizers")
    if optimizers is not None and not _no_optimizers(optimizers):
        return False
    return len(call.args[:1]) + ("models" in keywords) == 1 and len(call.args) <= 2


def _no_optimizers(node: ast.expr) -> bool:
    """`None` or `[]`: apex set up without optimizers."""
    return (isinstance(node, ast.Constant) and node.value is None) or (isinstance(node, (ast.List, ast.Tuple)) and not node.elts)


def state_class(tree: ast.Module, node: ast.AST) -> Optional[ast.ClassDef]:
    """The top-level class one of whose methods holds `node` in its own body (not in a function
    or class defined inside the method); None otherwise."""
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for method in cls.body:
            if isinstance(method, ast.FunctionDef) and any(inner is node for inner in _own_nodes(method)):
                return cls
    return None


def name_loads(tree: ast.Module) -> Set[str]:
    """The names the file reads, less a class naming itself in an old-style `super(Trainer, self)`
    in its own body (no construction, no escape of the class)."""
    own_super: Set[int] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == cls.name
                ):
                    own_super.add(id(node.args[0]))
    return {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in own_super
    }


def class_init(cls: ast.ClassDef) -> Optional[ast.FunctionDef]:
    return next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)


def _class_record(
    cls: ast.ClassDef, loads: Set[str], scaler: str, attributes: Set[str], apex_nodes: Optional[Set[int]] = None
) -> Tuple[List[str], str, str]:
    """A checkpoint saver class (`TrainingRestorer(opts, model, optimizer)` whose `save()` runs
    `amp.state_dict()`): its constructor takes the scaler as a new parameter, stored first thing
    in `__init__` as `self.<scaler>`, and its methods read it there. The record is the helper's:
    (the constructor's parameters, the scaler's name, why not). Beside `*args` / `**kwargs` the
    scaler is a keyword-only parameter: every call of the run passes it by keyword, and none
    unpacks arguments (rules/apex/_checkpoint_threading.py `helper_calls`). With `apex_nodes`
    (ids of the file's apex.amp uses), only the methods holding one must be plain: the others
    never read the scaler (a `@torch.no_grad()` sampler beside the training step)."""
    init = class_init(cls)
    params = _params(init)[1:] if init is not None else []
    problem = ""
    if cls.name in loads:
        problem = f"`{cls.name}` is also used in its own file, where no GradScaler is made"
    elif not scaler or scaler in attributes:
        problem = "every usual name for the scaler is taken in this file"
    elif cls.decorator_list or cls.keywords or any(not isinstance(b, (ast.Name, ast.Attribute)) for b in cls.bases):
        # Plain base classes are fine: the class's own `__init__` takes the scaler, and no other
        # attribute of the file has the scaler's name (above), so a base's attributes keep theirs.
        problem = f"`{cls.name}` has a metaclass, decorators or computed base classes, so its construction cannot be followed"
    elif init is None or not init.args.args:
        problem = f"`{cls.name}` has no `__init__` of its own to take the scaler"
    elif init.args.posonlyargs or scaler in {a.arg for a in (init.args.vararg, init.args.kwarg) if a is not None}:
        problem = f"`{cls.name}.__init__` takes positional-only parameters or `*{scaler}`"
    else:
        for statement in cls.body:
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and "__slots__" in ast.dump(statement):
                problem = f"`{cls.name}` declares `__slots__`"
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name in ("__setattr__", "__getattribute__", "__new__"):
                problem = f"`{cls.name}` defines `{statement.name}`"
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                apex_nodes is None or any(id(n) in apex_nodes for n in ast.walk(statement))
            ):
                instance = statement.args.args[0].arg if statement.args.args else None
                if statement.decorator_list or instance is None:
                    problem = f"`{cls.name}.{statement.name}()` is not a plain method"
                elif any(isinstance(n, ast.Name) and n.id == instance and not isinstance(n.ctx, ast.Load) for n in ast.walk(statement)):
                    problem = f"`{cls.name}.{statement.name}()` rebinds `{instance}`"
            if problem:
                break
    return (params, scaler, problem)


# ---------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class StateDecision:
    migrate: bool
    reason: str = ""
    scaler: str = ""  # the helper's new parameter (the callers' keyword)
    callers: Tuple[str, ...] = ()  # relative to the run's root
    caller_paths: Tuple[str, ...] = ()
    # Callers that set apex up for inference only (`apex_inference_only`): they pass no scaler,
    # so the helper's parameter defaults to None and its load is skipped there. In apex that load
    # set the scale of loss scalers such a program never uses.
    unpassed_paths: Tuple[str, ...] = ()

    @property
    def optional(self) -> bool:
        return bool(self.unpassed_paths)


def decide_state(index: "ProjectIndex", path: str, function: str, alone: bool = False) -> StateDecision:
    """Whether checkpoint helper `function` of the module at `path` and every file calling it
    migrate together, by the index facts alone (both sides call this and get the same answer).
    A helper no file of the run calls takes the scaler too when another helper of its file is
    called by the run (the run holds the program using the file; every call, none, passes it);
    `alone` asks without that."""
    absolute = os.path.abspath(path)
    summary = index.modules.get(absolute)
    here = index.relative(absolute)
    records = summary.apex_state_functions if summary is not None else {}
    if "<other>" in records:
        return StateDecision(False, f"in {here}: {records['<other>'][2]}")
    record = records.get(function)
    if record is None:
        return StateDecision(False, f"`{function}()` in {here} does not save or load apex's amp state")
    _, scaler, problem = record
    if problem:
        return StateDecision(False, f"in {here}: {problem}")
    callers: List[str] = []
    paths: List[str] = []
    unpassed: List[str] = []
    sig = signature(index, absolute, function)
    for other, how, source in _importing(index, absolute):
        where = index.relative(other)
        if other in relays(index, absolute, function):
            continue  # a package's `from .checkpoint import save_checkpoint`: its importers call it
        if how.ambiguity(function):
            return StateDecision(
                False, f"{where} imports `{how.ambiguity(function)}`, which may be {index.relative(source)} or another file of the run, so its "
                f"calls of `{function}()` cannot be followed"
            )
        if function not in how.names and not how.module and not how.star:
            continue
        found = uses(index, other, source, function)
        there = index.relative(source)
        if found is None:
            return StateDecision(False, f"{where} imports {there} and cannot be read again")
        if found.escapes:
            return StateDecision(
                False, f"{where} uses the module `{found.escapes}` ({there}) otherwise than through its attributes, "
                f"so its calls of `{function}()` cannot be followed"
            )
        if found.rebound:
            return StateDecision(
                False, f"{where} imports `*` from {there} and binds `{function}` itself: which one its calls see is unsure"
            )
        if found.other:
            return StateDecision(False, f"{where} uses `{function}()` otherwise than by calling it")
        if function in found.spellings and function in index.imported_from(other):
            return StateDecision(
                False, f"{where} re-exports `{function}()` (other files import it from there), so its calls cannot be followed"
            )
        if not found.calls:
            continue
        facts = index.modules[other]
        if facts.apex_initializes and facts.apex_inference_only:
            if function not in summary.apex_state_loaders_only:
                return StateDecision(
                    False, f"{where} sets apex up for inference only and calls `{function}()`, which saves apex's amp "
                    "state: there is no GradScaler there to save"
                )
            unpassed.append(other)
            continue
        if not facts.apex_initializes:
            binding = [c for c in found.calls if sig is None or binds(sig, c, scaler)]
            if binding:
                return StateDecision(
                    False,
                    f"{where} calls `{function}()` and has no `amp.initialize` to create the GradScaler it would take "
                    "(every caller must pass one)",
                )
            continue  # every call lacks a required argument: `TypeError` before the helper runs, before and after
        callers.append(where)
        paths.append(other)
    if unpassed:
        return StateDecision(True, "", scaler, tuple(callers), tuple(paths), tuple(unpassed))
    if not callers:
        unused = StateDecision(False, f"no file of the run with `amp.initialize` calls `{function}()` from {here}")
        if alone:
            return unused
        for other in records:
            if other != function and decide_state(index, path, other, alone=True).migrate:
                return StateDecision(True, "", scaler)
        return unused
    return StateDecision(True, "", scaler, tuple(callers), tuple(paths))


def _importing(index: "ProjectIndex", path: str) -> List[Tuple[str, Importing, str]]:
    summary = index.modules.get(path)
    return importers_through_relays(index, path, sorted(summary.apex_state_functions) if summary is not None else [])


def _helper_importers(index: "ProjectIndex") -> Dict[str, List[Tuple[str, Importing, str]]]:
    """{a helper's file: the files that may import it (or a relay of it), how, and from where},
    once per index."""
    memo = index.__dict__.get("_apex_helper_importers")
    if memo is None:
        memo = {
            path: _importing(index, path)
            for path, summary in sorted(index.modules.items())
            if summary.apex_state_functions and "<other>" not in summary.apex_state_functions
        }
        index.__dict__["_apex_helper_importers"] = memo
    return memo


def state_helpers_called(index: "ProjectIndex", path: str) -> Dict[str, Tuple[str, str]]:
    """For a caller's file: {the helper as spelled there: (helper's path, helper's name)} of the
    checkpoint helpers it imports (`load_checkpoint` after `from utils import load_checkpoint`,
    `utils.load_checkpoint` after `import utils`, `U.load_checkpoint` after `import pkg.utils as U`)."""
    absolute = os.path.abspath(path)
    found: Dict[str, Tuple[str, str]] = {}
    for helper, importing in _helper_importers(index).items():
        for other, how, source in importing:
            if other != absolute or how.ambiguous:
                continue
            for name in index.modules[helper].apex_state_functions:
                if not (name in how.names or how.module or how.star):
                    continue
                if source != helper and source not in relayed_by(index, helper, name):
                    continue
                known = uses(index, absolute, source, name)
                for spelling in known.spellings if known is not None else ():
                    found[spelling] = (helper, name)
    return found


def state_key(index: "ProjectIndex", path: str) -> str:
    """What of the index the checkpoint threading of the file at `path` depends on ("" if
    nothing): the helpers' and the callers' facts, and the bytes of each side and of every file
    that may import a helper (a new call there can flip the decision)."""
    absolute = os.path.abspath(path)
    facts = index.modules.get(absolute)
    if facts is None:
        return ""
    called = state_helpers_called(index, absolute)
    if not (facts.apex_state_functions or called):
        return ""
    parts: List[str] = []
    helpers: Set[str] = {absolute} if facts.apex_state_functions else set()
    helpers |= {p for p, _ in called.values()}
    for helper in sorted(helpers):
        parts.append(repr((helper, sorted(index.modules[helper].apex_state_functions.items()), index.digests.get(helper))))
        for other, how, source in _helper_importers(index).get(helper, ()):
            summary = index.modules[other]
            parts.append(repr((other, source, sorted(how.names), how.module, how.star, how.ambiguous, sorted(how.ambiguous_names.items()), summary.apex_initializes,
                               summary.apex_inference_only, index.digests.get(other))))
    relayed = {source for h in helpers for _, _, source in _helper_importers(index).get(h, ())}
    parts.append(resolution_key(index, helpers | relayed))
    return "|".join(parts)
