"""apex.amp split across two files: the facts the project index keeps, and the one decision.

The common shape of real apex code (maskrcnn-benchmark's tools/train_net.py and
engine/trainer.py): file A calls `model, optimizer = amp.initialize(model, optimizer, ...)` in a
function and hands the optimizer to `do_train(model, ..., optimizer, ...)` imported from module
B; B imports apex's amp itself and runs `with amp.scale_loss(losses, optimizer) as s:
s.backward()` then `optimizer.step()`. The migration threads one GradScaler through: A creates
it where `initialize` was and passes `scaler=scaler`; B's function takes a new `scaler`
parameter (rules/apex/_cross_threading.py).

The two files are fixed by independent per-file runs, so both decide from the same index facts
with `decide(index, b_path, function)`: B's function must have a shape the fix migrates and
take the optimizer in a known parameter, and every file of the run that imports it by name or
calls it (`trainer.do_train(...)` after `import trainer`: engine/caller_uses.py) must be an A side
that migrates (one `amp.initialize` of a shape the fix takes, the function called only with the
optimizer `initialize` returned, in the parameter B scales with). A file that calls the function
without apex, hands it (or B's module) on, or has an import that may be B or another file
(engine/import_resolution.py: imports resolve as Python finds them), makes both sides refuse.
The facts below are read with `ast` (the index never uses LibCST); they are a conservative
picture of what the planner takes, so that A never migrates without B, nor B without A.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ampmigrate.engine.apex_attrs import imports_apex_amp
from ampmigrate.engine.caller_uses import dotted as _callee
from ampmigrate.engine.caller_uses import uses
from ampmigrate.engine.import_resolution import importers, resolve
from ampmigrate.engine.import_resolution import key as resolution_key

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ModuleSummary, ProjectIndex

SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")  # as rules/apex/_scaler_access.py
_SAFE_LEVELS = ("O0", "O1", "O2")
_STATE_APIS = ("state_dict", "load_state_dict")  # the setup's own checkpoint calls (`_initializer_problem`)
# `amp.initialize`'s keywords: what each asks for, and whether the fix is then exact or unsafe,
# is the planner's to say (rules/apex/_amp_options.py); the group adopts its unsafe reasons.
_INIT_KEYWORDS = frozenset(
    {
        "enabled", "opt_level", "cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights",
        "loss_scale", "cast_model_outputs", "num_losses", "verbosity", "min_loss_scale", "max_loss_scale",
    }
)


# ---------------------------------------------------------------------------------- facts
def summarize_threading(tree: ast.Module, summary: "ModuleSummary") -> None:
    """Fill `apex_init_function`, `apex_init_problem`, `apex_init_calls` (the A side) and
    `apex_step_functions` (the B side) of one module."""
    tree, amp_names = apex_amp_tree(tree)
    if not amp_names:
        return
    uses = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in amp_names
    ]
    apis = [node.attr for node in uses]
    inits = [n for n in uses if n.attr in ("initialize", "init")]
    if inits and "scale_loss" not in apis:
        _initializer(tree, summary, amp_names, uses)
        from ampmigrate.engine.apex_owned_optimizer import instance_setup  # `amp.initialize(m, m.optimizer)`

        instance_setup(tree, summary, inits[0], uses)
    elif "scale_loss" in apis and not inits and not _spelled_out_inits(tree):
        _step_functions(tree, summary, amp_names, uses)
    elif len(inits) == 1:
        _gradient_calls(tree, summary, amp_names, inits[0])


def _gradient_calls(tree: ast.Module, summary: "ModuleSummary", amp_names: Set[str], init: ast.Attribute) -> None:
    """A file that sets apex up and scales its own losses: the calls after its `amp.initialize`
    passing the optimizer it returns (to an input-gradient function of another file,
    engine/apex_input_gradients.py)."""
    from ampmigrate.engine.apex_input_gradients import optimizer_calls

    function = _enclosing_top_function(tree, init)
    if function is None and not any(n is init for n in _own_nodes(tree)):
        return
    scope = function if function is not None else tree
    call = _parent_call(scope, init)
    assign = next((s for s in ast.walk(scope) if isinstance(s, ast.Assign) and s.value is call), None) if call else None
    target = assign.targets[0] if assign is not None and len(assign.targets) == 1 else None
    if not (isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name)):
        return
    summary.apex_gradient_calls = optimizer_calls(scope, call.lineno, target.elts[1].id, amp_names)


def _spelled_out_inits(tree: ast.Module) -> bool:
    """`apex.amp.initialize(...)` after `import apex`, beside `from apex import amp` (a re-id
    baseline's main file): the file sets apex up itself, so it is no step side of another's."""
    modules = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "apex" or (a.name.startswith("apex.") and not a.asname)
    }
    modules = {m.partition(".")[0] for m in modules}
    return any(
        isinstance(node, ast.Attribute) and node.attr in ("initialize", "init")
        and isinstance(node.value, ast.Attribute) and node.value.attr == "amp"
        and isinstance(node.value.value, ast.Name) and node.value.value.id in modules
        for node in ast.walk(tree)
    )


def apex_amp_tree(tree: ast.Module) -> Tuple[ast.Module, Set[str]]:
    """(the tree as the facts read it, the names apex's amp module has there): where the file
    also spells `apex.amp` out after `import apex` (engine/apex_spelled.py), a view of it reading
    that as one more name, beside any `from apex import amp` of the same file."""
    from ampmigrate.engine.apex_spelled import view

    spelled = view(tree)
    if spelled is not None:
        tree = spelled
    return tree, _apex_amp_names(tree)


def _apex_amp_names(tree: ast.Module) -> Set[str]:
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "apex" and not node.level:
            names.update(a.asname or a.name for a in node.names if a.name == "amp")
        elif isinstance(node, ast.Import):
            names.update(a.asname for a in node.names if a.name == "apex.amp" and a.asname)
    return names


def _top_functions(tree: ast.Module) -> List[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef)]


def _enclosing_top_function(tree: ast.Module, node: ast.AST) -> Optional[ast.FunctionDef]:
    for function in _top_functions(tree):
        if any(inner is node for inner in ast.walk(function)):
            return function
    return None


def _own_nodes(root: ast.AST):
    """The nodes of a function's body (or a module's top level), not those of functions,
    classes or lambdas defined in it."""
    stack = list(ast.iter_child_nodes(root))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _params(function: ast.FunctionDef) -> List[str]:
    args = function.args
    return [a.arg for a in [*args.posonlyargs, *args.args]]


def _initializer(tree: ast.Module, summary: "ModuleSummary", amp_names: Set[str], uses: List[ast.Attribute]) -> None:
    """The A side: one `a, b = amp.initialize(model, optimizer, opt_level=...)` in a top-level
    function (or at the top level of the module: "<module>"), and the calls there (after it)
    that pass the optimizer it returns."""
    init = next(n for n in uses if n.attr in ("initialize", "init"))
    function = _enclosing_top_function(tree, init)
    if function is None and not any(n is init for n in _own_nodes(tree)):
        from ampmigrate.engine.apex_base_class import setup_class

        setup_class(tree, summary, init, uses)  # a base class's `__init__` (engine/apex_base_class.py)
        return  # any other method: not this shape (the in-file reasons stand)
    summary.apex_init_function = function.name if function is not None else "<module>"
    function = function if function is not None else tree
    problem = _initializer_problem(tree, function, init, uses)
    summary.apex_init_problem = problem or ""
    call = _parent_call(function, init)
    assign = next((s for s in ast.walk(function) if isinstance(s, ast.Assign) and s.value is call), None)
    target = assign.targets[0] if assign is not None and len(assign.targets) == 1 else None
    if not (isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name)):
        return  # no optimizer name to follow (the problem says why)
    optimizer = target.elts[1].id
    counts: Dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node.func):
            counts[_callee(node.func)] = counts.get(_callee(node.func), 0) + 1
    for node in _own_nodes(function):
        # `do_train(...)`, or `trainer.do_train(...)` after `import trainer` (engine/caller_uses.py)
        if not (isinstance(node, ast.Call) and _callee(node.func) and node.lineno > call.lineno):
            continue
        callee = _callee(node.func)
        if callee.partition(".")[0] in amp_names:
            continue  # apex's own call (the other arm's `amp.initialize` of a setup helper)
        for position, arg in enumerate(node.args):
            if isinstance(arg, ast.Name) and arg.id == optimizer:
                summary.apex_init_calls.append((callee, node.lineno, position, "", counts[callee]))
        for keyword in node.keywords:
            if keyword.arg and isinstance(keyword.value, ast.Name) and keyword.value.id == optimizer:
                summary.apex_init_calls.append((callee, node.lineno, -1, keyword.arg, counts[callee]))
    summary.apex_init_calls.sort(key=lambda item: item[1])


def _parent_call(function: ast.AST, attribute: ast.Attribute) -> Optional[ast.Call]:
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and node.func is attribute:
            return node
    return None


def _plain(node: ast.AST) -> bool:
    """`name` or `name.attribute` (`controller.model_main`)."""
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name))


def _initializer_problem(tree, function: ast.AST, init: ast.Attribute, uses) -> Optional[str]:
    if len([n for n in uses if n.attr in ("initialize", "init")]) != 1:
        return "`amp.initialize` is called more than once in this file"
    # A checkpoint's `amp.state_dict()` / `amp.load_state_dict(x)` in the same function (DAPS's
    # `train.py` saves `'amp': amp.state_dict()` beside the model's) become the scaler's there.
    own = {id(n) for n in _own_nodes(function)}
    other = next(
        (n.attr for n in uses if n.attr != "initialize" and not (n.attr in _STATE_APIS and id(n) in own)), None
    )
    if other is not None:
        return f"the file also uses `amp.{other}`"
    call = _parent_call(function, init)
    if call is None:
        return "`amp.initialize` is used without being called"
    assign = next((s for s in ast.walk(function) if isinstance(s, ast.Assign) and s.value is call), None)
    if (
        assign is None
        or len(assign.targets) != 1
        or not isinstance(assign.targets[0], (ast.Tuple, ast.List))
        or len(assign.targets[0].elts) != 2
        or not all(_plain(e) for e in assign.targets[0].elts)
        or not isinstance(assign.targets[0].elts[1], ast.Name)
    ):
        return "`amp.initialize` does not bind one model and one optimizer to names (`model, optimizer = amp.initialize(...)`)"
    if len(call.args) != 2 or not all(_plain(a) for a in call.args):
        return "`amp.initialize` is not given one model and one optimizer by name"
    for keyword in call.keywords:
        if keyword.arg not in _INIT_KEYWORDS:
            return f"`amp.initialize` is given `{keyword.arg or '**'}`, which apex's signature does not have"
        if keyword.arg == "opt_level" and isinstance(keyword.value, ast.Constant) and keyword.value.value not in _SAFE_LEVELS:
            return f"`opt_level={keyword.value.value!r}` is not O0, O1 or O2"
    return None


def _step_functions(tree: ast.Module, summary: "ModuleSummary", amp_names: Set[str], uses: List[ast.Attribute]) -> None:
    """The B side: top-level functions running `with amp.scale_loss(loss, <parameter>) as s:
    s.backward()` on the module's apex import; each with the problem the split migration has
    with it ("" when none)."""
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    taken |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in [*n.posonlyargs, *n.args, *n.kwonlyargs]}
    scaler = next((name for name in SCALER_NAMES if name not in taken), "")
    module_level_import = any(
        imports_apex_amp(node)
        for statement in tree.body
        for node in ([statement] if not isinstance(statement, ast.Try) else statement.body)
    )
    for function in _top_functions(tree):
        scales = [
            n for n in uses if n.attr == "scale_loss" and any(inner is n for inner in ast.walk(function))
        ]
        if not scales:
            continue
        positional = _params(function)
        problem, optimizer = _step_problem(tree, function, scales, uses, amp_names, module_level_import)
        if problem == _NO_STEP:  # an input gradient's helper? (engine/apex_input_gradients.py)
            from ampmigrate.engine.apex_input_gradients import input_gradient_problem

            problem = input_gradient_problem(tree, function, optimizer, scales)
            if not problem:
                summary.apex_gradient_functions.append(function.name)
        if not problem and not scaler:
            problem = "every usual name for the scaler is taken in this file"
        if not problem and function.name not in summary.apex_gradient_functions and _loaded(tree, function.name):
            relay = _relay(tree, function, optimizer, amp_names)
            if relay is None:
                problem = f"`{function.name}()` is also used in its own file, where no GradScaler is made"
            else:
                caller, carried = relay
                summary.apex_step_relays[function.name] = caller.name
                summary.apex_step_functions[caller.name] = (_params(caller), carried, scaler, "")
        summary.apex_step_functions[function.name] = (positional, optimizer, scaler, problem)
    summary.apex_plain_functions = _plain_functions(tree, amp_names, summary.apex_step_functions)
    outside = [n for n in uses if n.attr == "scale_loss" and _enclosing_top_function(tree, n) is None]
    if outside:
        from ampmigrate.engine.apex_base_class import subclass_steps  # a subclass of another file's setup class

        from ampmigrate.engine.apex_owned_optimizer import owned_optimizer_classes  # a class owning its optimizer

        summary.apex_subclass_steps, left = subclass_steps(tree, uses, outside, module_level_import)
        summary.apex_owned_optimizers, left = owned_optimizer_classes(tree, uses, left, module_level_import)
        taken = {id(n) for n in outside} - {id(n) for n in left}
        uses, outside = [n for n in uses if id(n) not in taken], left
    if outside:
        from ampmigrate.engine.apex_trainer_class import step_classes  # a trainer class's method

        classes, outside = step_classes(tree, uses, scaler, module_level_import)
        summary.apex_step_functions.update(classes)
    if outside:
        summary.apex_step_functions["<other>"] = ([], "", "", "`amp.scale_loss` is used outside a top-level function")


def _plain_functions(tree: ast.Module, amp_names: Set[str], steps) -> List[str]:
    """The top-level functions of a B side an A side may hand its optimizer to without a scaler:
    they read no apex, step and backpropagate nothing, call no step function and hand none of
    their parameters to a call (SINet's `adjust_lr(optimizer, epoch, ...)` beside its `trainer`).
    An optimizer behaves the same after the migration as before it everywhere but in `step()`."""
    plain: List[str] = []
    for function in _top_functions(tree):
        if function.name in steps:
            continue
        nodes = list(ast.walk(function))
        if any(isinstance(n, ast.Name) and (n.id in amp_names or n.id == "apex") for n in nodes):
            continue
        if any(
            isinstance(n, ast.Call) and (
                (isinstance(n.func, ast.Attribute) and n.func.attr in ("step", "backward"))
                or (isinstance(n.func, ast.Name) and n.func.id in steps)
            )
            for n in nodes
        ):
            continue
        if any(isinstance(n, ast.Name) and n.id in steps for n in nodes):
            continue  # a step function handed on
        params = set(_params(function)) | {a.arg for a in function.args.kwonlyargs}
        if any(
            isinstance(arg, ast.Name) and arg.id in params
            for n in nodes if isinstance(n, ast.Call)
            for arg in (*n.args, *(k.value for k in n.keywords))
        ):
            continue  # hands a parameter (the optimizer, maybe) on: to what, the index does not follow
        plain.append(function.name)
    return plain


_NO_STEP = "no step"  # `_step_problem`'s answer for a function that never steps its optimizer


def _step_problem(tree, function: ast.FunctionDef, scales, uses, amp_names, module_level_import) -> Tuple[str, str]:
    local_import = any(imports_apex_amp(n) for n in ast.walk(function))
    if not (module_level_import or local_import):
        return "apex's amp is not imported at the top of this file nor in the function", ""
    inside = {id(n) for n in ast.walk(function)}
    stray = sorted({n.attr for n in uses if n.attr != "scale_loss" and not (n.attr == "master_params" and id(n) in inside)})
    if stray:
        return f"the file also uses `amp.{stray[0]}`, which the split migration does not rewrite", ""
    positional = _params(function)
    given: Set[str] = set()
    calls = []
    for attribute in scales:  # several scaled losses (an attack's input gradient, then the step)
        call = _parent_call(function, attribute)
        problem = scaled_with_problem(function, call)
        if problem:
            return problem, ""
        calls.append(call)
        optimizer_node = call.args[1] if len(call.args) >= 2 else next(
            (k.value for k in call.keywords if k.arg == "optimizers"), None
        )
        if not (isinstance(optimizer_node, ast.Name) and optimizer_node.id in positional):
            return "the optimizer passed to `amp.scale_loss` is not a parameter of the function", ""
        given.add(optimizer_node.id)
    if len(given) != 1:
        return f"`{function.name}()` scales losses for more than one optimizer", ""
    optimizer = given.pop()
    call = min(calls, key=lambda c: (c.lineno, c.col_offset))
    if any(isinstance(n, (ast.Assign, ast.AugAssign)) and any(
        isinstance(t, ast.Name) and t.id == optimizer for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
    ) for n in ast.walk(function)):
        return f"`{optimizer}` is rebound in `{function.name}()`", ""
    if any(
        optimizer in _params(n) + [a.arg for a in n.args.kwonlyargs]
        for n in ast.walk(function) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and n is not function
    ):
        # A closure scaling with its own `optimizer` parameter, not the one the callers pass.
        return f"a function inside `{function.name}()` takes its own `{optimizer}`", ""
    steps = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "step"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == optimizer
    ]
    if not steps:
        return _NO_STEP, optimizer
    if not any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in positional and n.lineno < call.lineno
        for n in ast.walk(function)
    ):
        return "no call of a model parameter (the forward pass) comes before the loss is scaled", ""
    return "", optimizer


def _loaded(tree: ast.Module, name: str) -> List[ast.Name]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]


def _relay(tree: ast.Module, function: ast.FunctionDef, optimizer: str, amp_names: Set[str]):
    """`def train(model, optimizer, ...): for epoch ...: train_epoch(model, optimizer, ...)`
    beside the step function `train_epoch`, and the other files call `train` with the optimizer
    of `amp.initialize`: (the relaying top-level function, its parameter carrying the optimizer),
    when every use of the step function in its file is such a call from that one function, which
    names no apex and is itself not used in the file. The scaler then threads through both."""
    loads = _loaded(tree, function.name)
    callers = {id(_enclosing_top_function(tree, n)): _enclosing_top_function(tree, n) for n in loads}
    if len(callers) != 1:
        return None
    caller = next(iter(callers.values()))
    if caller is None or caller is function or _loaded(tree, caller.name):
        return None
    if any(isinstance(n, ast.Name) and n.id in amp_names for n in ast.walk(caller)):
        return None
    calls = [n for n in ast.walk(caller) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function.name]
    if len(calls) != len(loads):
        return None  # the step function is used in it otherwise than called
    position = _params(function).index(optimizer)
    carried = set()
    for call in calls:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        given = call.args[position] if position < len(call.args) else next(
            (k.value for k in call.keywords if k.arg == optimizer), None
        )
        if not isinstance(given, ast.Name):
            return None
        carried.add(given.id)
    if len(carried) != 1 or not carried <= set(_params(caller)):
        return None
    (name,) = carried
    if any(isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load) for n in ast.walk(caller)):
        return None  # rebound in the relaying function
    return caller, name


def scaled_with_problem(root: ast.AST, call: Optional[ast.Call]) -> str:
    """Why `call` (`amp.scale_loss(...)` in `root`) is not `with amp.scale_loss(loss, opt) as s:
    s.backward()`, the shape the split migration takes ("" when it is)."""
    with_node = next(
        (w for w in ast.walk(root) if isinstance(w, ast.With) and len(w.items) == 1 and w.items[0].context_expr is call),
        None,
    )
    if call is None or with_node is None:
        return "`amp.scale_loss` is not the only item of a `with` statement"
    target = with_node.items[0].optional_vars
    if not isinstance(target, ast.Name):
        return "`with amp.scale_loss(...)` does not bind the scaled loss to a name"
    # The planner keeps a body that does more (an all-reduce, logging, `scaled = scaler.scale(loss)`
    # where the scaled loss is used again) when it never leaves the block early nor rebinds the
    # scaled loss; each side's own plan has the last word (rules/apex/_cross_threading.py).
    for node in (n for statement in with_node.body for n in ast.walk(statement)):
        if isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Raise, ast.Yield, ast.YieldFrom, ast.Await,
                             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Global, ast.Nonlocal)):
            return "the body of `with amp.scale_loss(...)` may leave the block early"
        if isinstance(node, ast.Name) and node.id == target.id and not isinstance(node.ctx, ast.Load):
            return "the body of `with amp.scale_loss(...)` rebinds the scaled loss"
    # `delay_unscale=` (accumulation) is the planner's to judge, as in a file of its own.
    if len(call.args) > 2 or any(k.arg not in ("optimizers", "delay_unscale") for k in call.keywords):
        return "`amp.scale_loss` is given more than the loss, the optimizer and `delay_unscale`"
    return ""


# ---------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class Decision:
    migrate: bool
    reason: str = ""  # why not, when not
    optimizer: str = ""  # B's parameter scaled with
    scaler: str = ""  # the name of B's new parameter (and A's keyword)
    callers: Tuple[str, ...] = ()  # relative to the run's root
    caller_paths: Tuple[str, ...] = ()  # absolute


def decide(index: "ProjectIndex", path: str, function: str, alone: bool = False) -> Decision:
    """Whether `function` of the module at `path` (a B side) and every file calling it (its A
    sides) migrate together, by the index facts. Both sides call this, with the same index, and
    get the same answer (rules/apex/_cross_threading.group_check then plans every side). A step
    function no file of the run calls (ninpy's `warmup()`, imported beside the `train()` that
    runs) takes the scaler too when another step function of its file migrates: the run holds
    the program using the file, and no call of it needs changing; `alone` asks without that."""
    absolute = os.path.abspath(path)
    summary = index.modules.get(absolute)
    if summary is not None and function in summary.apex_step_relays:
        # Called only by the function that relays the optimizer to it: both take the scaler, and
        # no other file may call it (it would miss the new parameter).
        caller = summary.apex_step_relays[function]
        for other, how in importers(index, absolute):
            found = uses(index, other, absolute, function) if (function in how.names or how.module or how.star) else None
            if function in how.names or how.ambiguity(function) or (found is not None and (found.calls or found.other or found.escapes)):
                return Decision(
                    False, f"{index.relative(other)} uses `{function}()` of {index.relative(absolute)}, which only "
                    f"`{caller}()` there should call once it takes the GradScaler"
                )
        return decide(index, path, caller)
    if summary is not None and function in summary.apex_gradient_functions:
        from ampmigrate.engine.apex_input_gradients import decide_input_gradient

        return decide_input_gradient(index, path, function)
    record = summary.apex_step_functions.get(function) if summary is not None else None
    here = index.relative(absolute)
    if record is None:
        return Decision(False, f"`{function}()` in {here} does not scale a loss with apex's amp")
    positional, optimizer, scaler, problem = record
    if problem:
        return Decision(False, f"in {here}: {problem}")
    callers: List[str] = []
    paths: List[str] = []
    for other, how, found, refusal in followed_uses(index, absolute, function):
        if refusal:
            return Decision(False, refusal)
        where = index.relative(other)
        if not found.calls and function not in how.names:
            continue  # imports the module and never names `function`
        if not found.calls and function not in index.imported_from(other):
            continue  # imports `function` by name and never uses it (nor do other files import it from there)
        facts = index.modules[other]
        if not facts.apex_init_function:
            return Decision(
                False,
                f"{where} {'calls' if found.calls else 'imports'} `{function}()` and has no `amp.initialize` to "
                "create the GradScaler it would take (every file importing it must pass one)",
            )
        if facts.apex_init_problem:
            return Decision(False, f"`amp.initialize` in {where} is not migrated: {facts.apex_init_problem}")
        if facts.apex_name_uses.get(function, (0, 0))[1]:
            return Decision(
                False, f"{where} uses `{function}` otherwise than by calling it (a subclass, a value passed on), "
                "so not every use of it can be given the GradScaler"
            )
        calls = [c for c in facts.apex_init_calls if c[0] in found.spellings]
        if not calls and facts.apex_name_uses.get(function, (0, 0))[0]:
            return Decision(
                False, f"{where} constructs or calls `{function}` before `amp.initialize`, or elsewhere than after it "
                "with the optimizer it returns, where the GradScaler would be created"
            )
        if not calls:
            return Decision(
                False, f"{where} does not call `{function}()` with the optimizer `amp.initialize` returns"
            )
        for _, line, position, keyword, total in calls:
            given = keyword or (positional[position] if 0 <= position < len(positional) else "")
            if given != optimizer:
                return Decision(
                    False,
                    f"{where}:{line} passes the optimizer to `{function}()` as `{given or '*'}`, not as `{optimizer}`, "
                    "the parameter it scales with",
                )
        if len({c[1] for c in calls}) != len(found.calls):
            return Decision(
                False, f"{where} calls `{function}()` elsewhere than with the optimizer `amp.initialize` returns"
            )
        targets, stray = _targets(index, other)
        if stray or len(targets) != 1:
            return Decision(
                False, stray or f"{where} hands the optimizer of `amp.initialize` to more than one training function"
            )
        callers.append(where)
        paths.append(other)
    if not callers and not any(True for _ in importers(index, absolute)):
        return Decision(
            False, f"no file of the run imports {here}, so the `amp.initialize` whose GradScaler `{function}()` would "
            "take is not in the run"
        )
    if not callers:
        unused = Decision(False, f"no file of the run calls `{function}()` from {here} after `amp.initialize`")
        if alone or any(found.calls for _, _, found, _ in followed_uses(index, absolute, function) if found is not None):
            return unused
        for other in summary.apex_step_functions:
            if other != function and other not in summary.apex_step_relays and decide(index, path, other, alone=True).migrate:
                return Decision(True, "", optimizer, scaler)
        return unused
    return Decision(True, "", optimizer, scaler, tuple(callers), tuple(paths))


def followed_uses(index: "ProjectIndex", absolute: str, function: str):
    """Each file of the run that may use `function` of the module at `absolute`: (the file, how it
    imports the module, its uses (engine/caller_uses.py), why they cannot be followed or "")."""
    from ampmigrate.engine.caller_uses import importers_through_relays, relayed_by

    relays = relayed_by(index, absolute, function)  # packages re-exporting it: their importers use it
    for other, how, source in importers_through_relays(index, absolute, [function]):
        if other in relays:
            continue
        if how.ambiguity(function):
            yield other, how, None, (
                f"{index.relative(other)} imports `{how.ambiguity(function)}`, which may be {index.relative(source)} or "
                f"another file of the run, so its calls of `{function}()` cannot be followed"
            )
            continue
        if function not in how.names and not how.module and not how.star:
            continue
        found = uses(index, other, source, function)
        yield other, how, found, _use_refusal(index, other, source, function, found)


def _use_refusal(index: "ProjectIndex", other: str, target: str, function: str, found) -> str:
    """Why the calls of `function` (of `target`) in `other` cannot be followed ("" when they can)."""
    where, here = index.relative(other), index.relative(target)
    if found is None:
        return f"{where} imports {here} and cannot be read again"
    if found.escapes:
        return (
            f"{where} uses the module `{found.escapes}` ({here}) otherwise than through its attributes, so its "
            f"calls of `{function}()` cannot be followed"
        )
    if found.rebound:
        return f"{where} imports `*` from {here} and binds `{function}` itself: which one its calls see is unsure"
    if found.other:
        return f"{where} uses `{function}()` otherwise than by calling it"
    return ""


def step_spellings(index: "ProjectIndex", absolute: str) -> Dict[str, Tuple[str, str]]:
    """{a step function as the file at `absolute` spells it (`do_train`, `trainer.do_train`):
    (B path, function)} for the step functions of files it imports (by name, as a module, `*`,
    or from a package re-exporting it)."""
    from ampmigrate.engine.caller_uses import importers_through_relays, relayed_by

    found: Dict[str, Tuple[str, str]] = {}
    for other, summary in sorted(index.modules.items()):
        if not summary.apex_step_functions or other == absolute:
            continue
        # through a package re-exporting it too (`from engine import finetune`): `decide` refuses
        # such a relay, and a file handing its optimizer to the function must see that
        for importer, how, source in importers_through_relays(index, other, sorted(summary.apex_step_functions)):
            if importer != absolute or how.ambiguous:
                continue
            for function in summary.apex_step_functions:
                if source != other and source not in relayed_by(index, other, function):
                    continue
                known = uses(index, absolute, source, function)
                for spelling in known.spellings if known is not None else ():
                    found[spelling] = (other, function)
    return found


def _targets(index: "ProjectIndex", absolute: str) -> Tuple[List[Tuple[str, str]], Optional[str]]:
    """The (B path, function) pairs an A side hands its optimizer to (imported by name from a
    file of the run that scales a loss with apex), and a reason when one is no threadable function."""
    facts = index.modules[absolute]
    imported = {name: module for module, name in facts.from_imports}
    spelled = step_spellings(index, absolute) if facts.apex_init_calls else {}
    targets: List[Tuple[str, str]] = []
    callees = [callee for callee, *_ in facts.apex_init_calls]
    for name in facts.apex_name_uses:  # also one not called with the optimizer: `decide` says why
        module = imported.get(name)
        other = resolve(index, absolute, module) if module else None
        if other is not None and name in index.modules[other].apex_step_functions and name not in callees:
            callees.append(name)
    for callee in callees:
        pair = spelled.get(callee)
        if pair is None:
            module = imported.get(callee)
            other = resolve(index, absolute, module) if module and "." not in callee else None
            if other is None or not index.modules[other].apex_step_functions:
                continue
            if callee in index.modules[other].apex_plain_functions:
                continue  # it only reads or tunes the optimizer (`adjust_lr`): it needs no scaler
            if callee not in index.modules[other].apex_step_functions:
                return [], f"{index.relative(other)} scales a loss with apex's amp, but not in `{callee}()`"
            pair = (other, callee)
        if pair not in targets:
            targets.append(pair)
    return targets, None


def initializer_targets(index: "ProjectIndex", path: str) -> Tuple[List[Tuple[str, str]], Optional[str]]:
    """For an A side: the (B path, function) pairs its optimizer is handed to, and why they
    cannot migrate (None when they can: then `decide` of the one target says how)."""
    absolute = os.path.abspath(path)
    facts = index.modules.get(absolute)
    if facts is None or not facts.apex_init_function:
        return [], "no `amp.initialize` of the split shape"
    targets, stray = _targets(index, absolute)
    if stray or not targets:
        return [], stray
    if facts.apex_init_problem:
        return targets, facts.apex_init_problem
    for other, callee in targets:
        decision = decide(index, other, callee)
        if not decision.migrate:
            return targets, decision.reason
    if len(targets) != 1:
        return targets, "the optimizer of `amp.initialize` goes to more than one training function"
    return targets, None


def threading_key(index: "ProjectIndex", path: str) -> str:
    """What of the index the split migration of the file at `path` depends on ("" if nothing):
    every file's threading facts and by-name imports of step functions (a change in any caller
    can flip the decision of both sides)."""
    absolute = os.path.abspath(path)
    facts = index.modules.get(absolute)
    if facts is None:
        return ""
    involved = bool(facts.apex_step_functions or facts.apex_init_function or facts.apex_gradient_calls)
    step_names = index.__dict__.get("_apex_step_names")
    if step_names is None:
        step_names = index.__dict__["_apex_step_names"] = frozenset(
            name for summary in index.modules.values() for name in summary.apex_step_functions
        )
    if not involved and step_names:
        for module, name in facts.from_imports:
            if name not in step_names:
                continue
            other = resolve(index, absolute, module)
            if other is not None and name in index.modules[other].apex_step_functions:
                involved = True
                break
    if not involved:
        return ""
    cached = getattr(index, "_threading_digest", None)
    if cached is None:
        steps = {name for summary in index.modules.values() for name in summary.apex_step_functions}
        step_files = [p for p, summary in index.modules.items() if summary.apex_step_functions]
        spelled = {name for p in step_files for name in index.module_names(p)}
        parts = [resolution_key(index, step_files)]
        for other, summary in sorted(index.modules.items()):
            if summary.apex_step_functions or summary.apex_init_function or summary.apex_gradient_calls:
                parts.append(
                    repr((other, sorted(summary.apex_step_functions.items()), summary.apex_init_function,
                          summary.apex_init_problem, summary.apex_init_calls, summary.apex_gradient_functions,
                          summary.apex_plain_functions,
                          summary.apex_gradient_calls, index.apex_sources.get(other, ("",))[0]))
                )
            imported = [(m, n) for m, n in summary.from_imports if n in steps or f"{m}.{n}" in spelled]
            plain = [m for m in (*summary.module_imports, *summary.star_imports) if m in spelled]
            if imported or plain:
                parts.append(repr((other, imported, plain, summary.edits_sys_path, index.digests.get(other))))
        cached = hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()
        index._threading_digest = cached
    return cached
