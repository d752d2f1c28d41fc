"""apex set up inside a helper function that returns the model and optimizer (facts, read with `ast`).

The shape (DPR's `setup_for_distributed_mode(model, optimizer, device, n_gpu, local_rank, fp16,
fp16_opt_level)`, HF-style `prepare(...)` helpers): a top-level function `H` of file A calls
`model, optimizer = amp.initialize(model, optimizer, opt_level=...)` (under `if fp16:` tests of
its parameters) and ends with `return model, optimizer` (or a longer tuple holding both); its
callers, in A or in other files, do `model, optimizer = H(...)` and then scale the loss with
`amp.scale_loss` (themselves or in functions they call).

The migration (rules/apex/_setup_helper.py): `H` keeps its signature and return values and its
`amp.initialize` goes (the model stays fp32, autocast goes around the forward passes); each
caller creates `torch.amp.GradScaler("cuda", enabled=<H's tests in the caller's terms>)` right
after the call and uses it in its training step. A caller that trains nothing through the helper
(no optimizer given, or one it never steps: DPR's `dense_retriever.py`) needs no scaler; its model
runs in fp32 once `amp.initialize` goes (the helper's fix notes it), as the in-file planner drops an
inference `amp.initialize`, and a cast to half in it stops the group. Every caller must migrate, or
none does.

`helper_of(tree)` describes `H` (or says why the file is not this shape); `helper_callers(index,
path, name)` lists the files of the run training with it (or why they cannot be followed),
`inference_callers(index, path, name)` the others.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ampmigrate.engine.apex_threading import _own_nodes, apex_amp_tree
from ampmigrate.engine.caller_uses import uses
from ampmigrate.engine.import_resolution import importers

if TYPE_CHECKING:
    from ampmigrate.engine.project_index import ProjectIndex

# `amp.initialize` keywords a helper may pass: the opt level and the loss scale are mapped into the
# caller's terms; `verbosity` only prints.
HELPER_KEYWORDS = ("opt_level", "loss_scale", "verbosity")


@dataclass
class Helper:
    """A setup helper `name` of the file at `path` (see the module docstring)."""

    path: str
    name: str
    params: List[str]  # positional-or-keyword parameters, in order
    kwonly: List[str]
    defaults: Dict[str, ast.expr]
    returns: int  # the length of the returned tuple
    model_index: int  # where the initialized model and optimizer are in it
    optimizer_index: int
    tests: List[Tuple[ast.expr, bool]] = field(default_factory=list)  # the `if`s around the call (test, taken)
    options: Dict[str, ast.expr] = field(default_factory=dict)  # `amp.initialize`'s keywords
    init_line: int = 0
    # what the helper assigns in the objects it is given: (name, its attribute or "" for any)
    stores: List[Tuple[str, str]] = field(default_factory=list)
    # the parameter the optimizer handed to `amp.initialize` comes from, when the helper never
    # binds it again ("" otherwise): a caller giving it `None` trains nothing through the helper
    optimizer_param: str = ""
    # the line of `if optimizer is None: model = amp.initialize(model, ...) else: model, optimizer =
    # amp.initialize(model, optimizer, ...)` when the helper has that inference arm (0 otherwise)
    arms_line: int = 0


def helper_of(tree: ast.Module, path: str) -> Tuple[Optional[Helper], str]:
    """(the setup helper of this module, "") or (None, why not); (None, "") when the module has
    no `amp.initialize` in a top-level function at all."""
    tree, amp_names = apex_amp_tree(tree)  # `import apex`, then `apex.amp.initialize(...)` too
    if not amp_names:
        return None, ""
    inits = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("initialize", "init")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in amp_names
    ]
    arms: Optional[ast.If] = None
    if len(inits) == 2:
        training, arms = _inference_arm(tree, inits)
        inits = [training] if training is not None else inits
    if len(inits) != 1:
        return None, ""
    call = inits[0]
    function = next(
        (f for f in tree.body if isinstance(f, ast.FunctionDef) and any(n is call for n in ast.walk(f))), None
    )
    if function is None or call.func.attr != "initialize":
        return None, ""
    name = function.name
    # The statement: `model, optimizer = amp.initialize(model, optimizer, ...)` with names.
    path_to = _path(function, call)
    statement = next((n for n in reversed(path_to) if isinstance(n, ast.stmt)), None)
    if not (
        isinstance(statement, ast.Assign)
        and statement.value is call
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], (ast.Tuple, ast.List))
        and len(statement.targets[0].elts) == 2
        and all(isinstance(e, ast.Name) for e in statement.targets[0].elts)
    ):
        return None, f"`amp.initialize` in `{name}()` does not bind one model and one optimizer to names"
    if len(call.args) != 2 or not all(isinstance(a, ast.Name) for a in call.args):
        return None, f"`amp.initialize` in `{name}()` is not given one model and one optimizer by name"
    model, optimizer = (e.id for e in statement.targets[0].elts)
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)) for n in _own_nodes(function)):
        return None, f"`{name}()` is a generator or binds globals"
    args = function.args
    if args.vararg or args.kwarg or args.posonlyargs:
        return None, f"`{name}()` takes `*args`, `**kwargs` or positional-only parameters"
    params = [a.arg for a in args.args]
    kwonly = [a.arg for a in args.kwonlyargs]
    defaults: Dict[str, ast.expr] = {}
    for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
        defaults[arg.arg] = default
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is not None:
            defaults[arg.arg] = default
    # Where the call sits: under `if`s only (a `try` around an import is fine, not around it).
    tests: List[Tuple[ast.expr, bool]] = []
    for outer, inner in zip(path_to, path_to[1:]):
        if inner is statement:
            if not isinstance(outer, (ast.If, ast.FunctionDef)):
                return None, f"`amp.initialize` in `{name}()` runs inside a loop, a `with` or a `try`"
        if outer is arms:
            continue  # a caller that trains gives an optimizer: the inference arm is not its setup
        if isinstance(outer, ast.If) and isinstance(inner, ast.stmt):
            tests.append((outer.test, any(inner is s for s in outer.body)))
        elif isinstance(outer, (ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)):
            return None, f"`amp.initialize` in `{name}()` runs inside a loop, a `with` or a `try`"
    # The one return, last: a tuple holding the model and the optimizer by name.
    # (the inference arm may end with its own `return model`: `_inference_arm`)
    arm_returns = [s for s in (*arms.body, *arms.orelse) if isinstance(s, ast.Return)] if arms is not None else []
    returns = [n for n in _own_nodes(function) if isinstance(n, ast.Return) and n not in arm_returns]
    last = function.body[-1]
    if len(returns) != 1 or returns[0] is not last or not isinstance(last.value, ast.Tuple):
        return None, f"`{name}()` does not end with its only `return`, of a tuple"
    elements = last.value.elts
    names = [e.id if isinstance(e, ast.Name) else None for e in elements]
    if names.count(model) != 1 or names.count(optimizer) != 1:
        return None, f"`{name}()` does not return `{model}` and `{optimizer}` (what `amp.initialize` bound) in its tuple"
    options: Dict[str, ast.expr] = {}
    for keyword in call.keywords:
        if keyword.arg not in HELPER_KEYWORDS:
            return None, (
                f"`amp.initialize` in `{name}()` is given `{keyword.arg or '**'}`, which the setup-helper migration "
                "does not map into its callers' terms"
            )
        options[keyword.arg] = keyword.value
    scale = options.get("loss_scale")
    if isinstance(scale, ast.Name) and scale.id not in params + kwonly:
        source = float_or_dynamic_source(function, scale.id)
        if source is not None:
            options["loss_scale"] = source  # apex reads a number, a numeric string or 'dynamic' alike
    # (`model, optimizer = amp.initialize(model, optimizer)` itself binds them again after its tests
    # ran, to the same objects apex patched: not a change of what decided the setup)
    own_targets = {id(e) for e in statement.targets[0].elts}
    rebound = {
        n.id
        for n in _own_nodes(function)
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)) and n.id in params + kwonly
        and id(n) not in own_targets
    }
    used = {n.id for test, _ in tests for n in ast.walk(test) if isinstance(n, ast.Name)}
    used |= {n.id for v in options.values() for n in ast.walk(v) if isinstance(n, ast.Name)}
    if used & rebound:
        return None, f"`{name}()` rebinds its parameter `{sorted(used & rebound)[0]}` that decides its apex setup"
    stores = sorted(
        {
            _first_step(n)
            for n in _own_nodes(function)
            if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)) and _first_step(n)[0]
        }
        | {
            (_first_step(n.args[0])[0], "")
            for n in _own_nodes(function)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr") and n.args
            and _first_step(n.args[0])[0]
        }
    )
    given = call.args[1].id
    optimizer_param = (
        given
        if given in params + kwonly
        and not any(
            isinstance(n, ast.Name) and n.id == given and isinstance(n.ctx, (ast.Store, ast.Del))
            and n is not statement.targets[0].elts[1]
            for n in _own_nodes(function)
        )
        else ""
    )
    helper = Helper(
        path=path,
        name=name,
        params=params,
        kwonly=kwonly,
        defaults=defaults,
        returns=len(elements),
        model_index=names.index(model),
        optimizer_index=names.index(optimizer),
        tests=tests,
        options=options,
        init_line=statement.lineno,
        stores=stores,
        optimizer_param=optimizer_param,
        arms_line=arms.lineno if arms is not None else 0,
    )
    if arms is not None and optimizer_param != call.args[1].id:
        return None, f"`{name}()` tests `{call.args[1].id}` for None but binds it again"
    return helper, ""


def float_or_dynamic_source(function: ast.FunctionDef, name: str) -> Optional[ast.expr]:
    """`E` where the local `name` is bound only by `if E != 'dynamic': name = float(E) else:
    name = 'dynamic'` (or `name = float(E) if E != 'dynamic' else 'dynamic'`, `==` with the
    arms swapped; ZenNAS, its forks): apex's `loss_scale` takes `E` itself to mean the same (it
    converts a number or a numeric string with `float()` and keeps 'dynamic')."""
    stores = [n for n in _own_nodes(function) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    assigns = [
        n for n in _own_nodes(function)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
    ]
    if not assigns or len(assigns) != len(stores):
        return None  # bound otherwise too (a loop, `+=`, a `with`)
    if len(assigns) == 1 and isinstance(assigns[0].value, ast.IfExp):
        choice = assigns[0].value
        return _float_or_dynamic(choice.test, choice.body, choice.orelse)
    if len(assigns) == 2:
        for statement in _own_nodes(function):
            if (
                isinstance(statement, ast.If) and len(statement.body) == 1 and len(statement.orelse) == 1
                and {id(statement.body[0]), id(statement.orelse[0])} == {id(a) for a in assigns}
            ):
                return _float_or_dynamic(statement.test, statement.body[0].value, statement.orelse[0].value)
    return None


def _float_or_dynamic(test: ast.expr, when_true: ast.expr, when_false: ast.expr) -> Optional[ast.expr]:
    if not (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "dynamic"
    ):
        return None
    source = test.left
    if isinstance(test.ops[0], ast.Eq):
        when_true, when_false = when_false, when_true
    elif not isinstance(test.ops[0], ast.NotEq):
        return None

    def same(node: ast.expr) -> bool:
        return ast.dump(node) == ast.dump(source)

    number = same(when_true) or (
        isinstance(when_true, ast.Call) and isinstance(when_true.func, ast.Name) and when_true.func.id == "float"
        and len(when_true.args) == 1 and not when_true.keywords and same(when_true.args[0])
    )
    dynamic = same(when_false) or (isinstance(when_false, ast.Constant) and when_false.value == "dynamic")
    return source if number and dynamic else None


def _inference_arm(tree: ast.Module, inits: List[ast.Call]) -> Tuple[Optional[ast.Call], Optional[ast.If]]:
    """(the training call, the `if`) for DPR's forks' `if optimizer is None: model =
    amp.initialize(model, [optimizer,] opt_level=L) else: model, optimizer = amp.initialize(model,
    optimizer, opt_level=L)`: one setup whose first arm runs for the callers that give no optimizer
    (inference callers, which the migration notes); else (None, None)."""
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    statements = [parents.get(id(call)) for call in inits]
    if not all(isinstance(s, ast.Assign) and s.value is c and len(s.targets) == 1 for s, c in zip(statements, inits)):
        return None, None
    for inference, training in ((0, 1), (1, 0)):
        i_call, t_call = inits[inference], inits[training]
        i_statement, t_statement = statements[inference], statements[training]
        branch = parents.get(id(t_statement))
        if not (isinstance(branch, ast.If) and parents.get(id(i_statement)) is branch):
            continue
        if not (len(t_call.args) == 2 and all(isinstance(a, ast.Name) for a in t_call.args)):
            continue
        model, optimizer = (a.id for a in t_call.args)
        none_first = _tests_none(branch.test, optimizer)
        if none_first is None or (branch.body[0] is i_statement) != none_first:
            continue
        inference_arm, training_arm = (branch.body, branch.orelse) if none_first else (branch.orelse, branch.body)
        # the inference arm may return its model itself (`model = amp.initialize(model, ...); return model`)
        returns_model = (
            none_first and len(inference_arm) == 2 and isinstance(inference_arm[1], ast.Return)
            and isinstance(inference_arm[1].value, ast.Name) and inference_arm[1].value.id == model
        )
        if not (len(training_arm) == 1 and (len(inference_arm) == 1 or returns_model)):
            continue
        target = i_statement.targets[0]
        given = i_call.args[1:] if i_call.args else [None]
        if not (
            isinstance(target, ast.Name) and target.id == model
            and i_call.args and isinstance(i_call.args[0], ast.Name) and i_call.args[0].id == model
            and len(given) <= 1
            and all((isinstance(g, ast.Name) and g.id == optimizer) or (isinstance(g, ast.Constant) and g.value is None) for g in given)
        ):
            continue
        if sorted(map(ast.dump, i_call.keywords)) != sorted(map(ast.dump, t_call.keywords)):
            continue
        return t_call, branch
    return None, None


def _tests_none(test: ast.expr, name: str) -> Optional[bool]:
    """True for `name is None` / `not name`, False for `name is not None` / `name`, else None."""
    if isinstance(test, ast.Name) and test.id == name:
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _tests_none(test.operand, name)
        return None if inner is None else not inner
    if (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) and test.left.id == name
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
    ):
        return True if isinstance(test.ops[0], ast.Is) else False if isinstance(test.ops[0], ast.IsNot) else None
    return None


def helper_of_source(index: "ProjectIndex", path: str) -> Tuple[Optional[Helper], str]:
    source = index.apex_sources.get(os.path.abspath(path))
    if source is None:
        return None, ""
    try:
        tree = ast.parse(source[1])
    except (SyntaxError, ValueError, RecursionError):
        return None, ""
    return helper_of(tree, os.path.abspath(path))


def helper_callers(index: "ProjectIndex", path: str, name: str) -> Tuple[List[str], str]:
    """(the other files of the run calling the helper `name` of the file at `path` to train, "") or
    ([], why they cannot all be followed): each must scale a loss with apex's amp, or train
    nothing through the helper (`inference_callers`), call the helper only, and import it
    unambiguously."""
    callers, _, reason = _helper_group(index, path, name)
    return callers, reason


def inference_callers(index: "ProjectIndex", path: str, name: str) -> List[Tuple[str, str]]:
    """[(file, what it does)] for the files of the run that call the helper and train nothing
    through it (no optimizer given, or one nothing steps); empty where the group cannot be followed."""
    callers, inference, reason = _helper_group(index, path, name)
    return [] if reason else inference


def _helper_group(index: "ProjectIndex", path: str, name: str) -> Tuple[List[str], List[Tuple[str, str]], str]:
    memo = index.__dict__.setdefault("_apex_setup_helper_callers", {})
    key = (os.path.abspath(path), name)
    if key not in memo:
        memo[key] = _classify_callers(index, path, name)
    return memo[key]


def _classify_callers(index: "ProjectIndex", path: str, name: str) -> Tuple[List[str], List[Tuple[str, str]], str]:
    absolute = os.path.abspath(path)
    here = index.relative(absolute)
    callers: List[str] = []
    inference: List[Tuple[str, str]] = []
    helper: Optional[Helper] = None
    for other, how in importers(index, absolute):
        where = index.relative(other)
        if how.ambiguity(name):
            return [], [], f"{where} imports `{how.ambiguity(name)}`, which may be {here} or another file of the run"
        if name not in how.names and not how.module and not how.star:
            continue
        found = uses(index, other, absolute, name)
        if found is None:
            return [], [], f"{where} imports {here} and cannot be read again"
        if found.escapes or found.rebound or found.other:
            return [], [], f"{where} uses `{name}` otherwise than by calling it"
        if not found.calls:
            if name in how.names:
                return [], [], f"{where} imports `{name}()` and never calls it"
            continue
        facts = index.modules[other]
        if other not in index.apex_sources or not (
            facts.apex_step_functions or facts.apex_subclass_steps or facts.apex_owned_optimizers
        ):  # (those of a setup class's subclasses or of a class owning its optimizer scale losses too)
            if helper is None:
                helper, _ = helper_of_source(index, absolute)
            why, what = _inference_use(index, other, helper, found.spellings)
            if why:
                return [], [], (
                    f"{where} calls `{name}()` and scales no loss with apex's amp itself, and it is not an "
                    f"inference use either ({why})"
                )
            inference.append((other, what))
            continue
        callers.append(other)
    return callers, inference, ""


def _inference_use(index: "ProjectIndex", path: str, helper: Optional[Helper], spellings) -> Tuple[str, str]:
    """("", what it does) when the file at `path` calls the setup helper only to run a model (no
    optimizer given, or one nothing steps afterwards), as the in-file planner's inference path
    takes `amp.initialize` without optimizers (rules/apex/_unused_optimizer.py); else (why not, "").
    Without `amp.initialize` its model runs in fp32, so a cast of inputs to half in the file stops it
    (an fp32 model would get fp16 inputs), as `_drop_inference_init` does."""
    from ampmigrate.engine.caller_uses import dotted, source_tree

    if helper is None or not helper.optimizer_param:
        return "the helper's optimizer is not a parameter it keeps, so what the call trains cannot be told", ""
    tree = source_tree(index, path)
    if tree is None:
        return "it cannot be read again", ""
    viewed, amp_names = apex_amp_tree(tree)
    if any(isinstance(n, ast.Name) and n.id in amp_names and isinstance(n.ctx, ast.Load) for n in ast.walk(viewed)):
        return "it uses apex's amp", ""  # (an import alone goes with the fix of its file)
    half = _half_cast_line(tree)
    if half:
        return (
            f"line {half} casts to half: without `amp.initialize` the helper's model stays fp32 and would get "
            "fp16 inputs"
        ), ""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and dotted(n.func) in spellings]
    if not calls:
        return "its calls of the helper cannot be found", ""
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    kinds = set()
    for call in calls:
        bound = _bind(helper, call)
        if bound is None:
            return f"line {call.lineno} passes arguments the helper's parameters cannot be matched to", ""
        level = _level_argument(helper, bound)
        if isinstance(level, ast.Constant) and level.value == "O3":
            return f"line {call.lineno} asks for O3 (pure fp16), which torch.amp cannot do", ""
        given = bound.get(helper.optimizer_param)
        if given is None:
            default = helper.defaults.get(helper.optimizer_param)
            if not (isinstance(default, ast.Constant) and default.value is None):
                return f"line {call.lineno} does not give the helper an optimizer argument", ""
            kinds.add("no optimizer")
        elif isinstance(given, ast.Constant) and given.value is None:
            kinds.add("no optimizer")
        elif _unstepped(tree, parents, call, given, helper):
            kinds.add("an optimizer nothing steps")
        else:
            return f"line {call.lineno} gives the helper an optimizer the file may train with", ""
    return "", " and ".join(sorted(kinds))


def _bind(helper: Helper, call: ast.Call) -> Optional[Dict[str, ast.expr]]:
    bound: Dict[str, ast.expr] = {}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(helper.params):
        return None
    for param, arg in zip(helper.params, call.args):
        bound[param] = arg
    for keyword in call.keywords:
        if keyword.arg in bound or keyword.arg not in helper.params + helper.kwonly:
            return None
        bound[keyword.arg] = keyword.value
    return bound


def _level_argument(helper: Helper, bound: Dict[str, ast.expr]) -> Optional[ast.expr]:
    option = helper.options.get("opt_level")
    if isinstance(option, ast.Name) and option.id in helper.params + helper.kwonly:
        return bound.get(option.id, helper.defaults.get(option.id))
    return option


def _half_cast_line(tree: ast.Module) -> int:
    """The line of a `.half()` call or a float16 dtype in the file (0: none)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "half":
            return node.lineno
        if isinstance(node, ast.Attribute) and node.attr in ("float16", "HalfTensor") or (
            isinstance(node, ast.Attribute) and node.attr == "half" and isinstance(node.value, ast.Name) and node.value.id == "torch"
        ):
            return node.lineno
        if isinstance(node, ast.Constant) and node.value in ("float16", "half", "fp16") and _is_dtype_argument(tree, node):
            return node.lineno
    return 0


def _is_dtype_argument(tree: ast.Module, node: ast.Constant) -> bool:
    """`.to("float16")`-style uses: the string as an argument of `.to()`/`.type()` or a `dtype=` keyword."""
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        if any(k.value is node and k.arg == "dtype" for k in call.keywords):
            return True
        if isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "type") and any(a is node for a in call.args):
            return True
    return False


def _unstepped(tree: ast.Module, parents: Dict[int, ast.AST], call: ast.Call, given: ast.expr, helper: Helper) -> bool:
    """`net, opt = H(net, optimizer, ...)` in a function that made `optimizer` and reads neither it
    (but as this argument, and where it was made) nor the `opt` returned anywhere: the optimizer
    object reaches nothing that steps it (the shape of `optimizers_unused` in rules/apex/_unused_optimizer.py)."""
    if not isinstance(given, ast.Name):
        return False
    statement = parents.get(id(call))
    if not (
        isinstance(statement, ast.Assign)
        and statement.value is call
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], (ast.Tuple, ast.List))
        and len(statement.targets[0].elts) == helper.returns
    ):
        return False
    returned = statement.targets[0].elts[helper.optimizer_index]
    if not isinstance(returned, ast.Name):
        return False
    function = parents.get(id(statement))
    while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(function, (ast.For, ast.While, ast.AsyncFor)):
            return False  # a later round reads what this one bound
        function = parents.get(id(function))
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    args = function.args
    if given.id in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
        return False  # the function's caller holds the optimizer too
    made = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and {given.id, returned.id} & set(node.names):
            return False
        if not isinstance(node, ast.Name) or node is given or node is returned:
            continue
        if node.id == returned.id and returned.id != given.id:
            if returned.id != "_" or isinstance(node.ctx, ast.Load):
                return False
            continue
        if node.id != given.id:
            continue
        if isinstance(node.ctx, ast.Store) and node.lineno < call.lineno and _inside(parents, node, function):
            made = True
            continue
        return False  # read, or bound elsewhere: it may be stepped
    return made


def _inside(parents: Dict[int, ast.AST], node: ast.AST, root: ast.AST) -> bool:
    current = parents.get(id(node))
    while current is not None:
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return current is root
        current = parents.get(id(current))
    return False


def helpers_called_by(index: "ProjectIndex", path: str) -> List[Tuple[str, str, frozenset]]:
    """[(helper file, helper name, how this file spells it)] for the setup helpers of other files
    that the file at `path` calls."""
    absolute = os.path.abspath(path)
    found: List[Tuple[str, str, frozenset]] = []
    for other, summary in sorted(index.modules.items()):
        if other == absolute or not summary.apex_init_function or other not in index.apex_sources:
            continue
        if summary.apex_init_function == "<module>" or summary.apex_step_functions:
            continue
        for importer, how in importers(index, other):
            if importer != absolute:
                continue
            known = uses(index, absolute, other, summary.apex_init_function)
            if known is not None and known.calls:
                found.append((other, summary.apex_init_function, frozenset(known.spellings)))
    return found


def _path(root: ast.AST, target: ast.AST) -> List[ast.AST]:
    """The nodes from `root` down to `target` (both included)."""
    stack = [(root, [root])]
    while stack:
        node, trail = stack.pop()
        if node is target:
            return trail
        for child in ast.iter_child_nodes(node):
            stack.append((child, trail + [child]))
    return []


def _first_step(node: ast.AST) -> Tuple[str, str]:
    """`args.fp16.x = ...` -> ("args", "fp16"); `args[k] = ...` -> ("args", ""); ("", "") without a name at the root."""
    first = ""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        first = node.attr if isinstance(node, ast.Attribute) else ""
        node = node.value
    return (node.id, first) if isinstance(node, ast.Name) else ("", "")


def test_chains(test: ast.expr, params: List[str]) -> List[Tuple[str, str]]:
    """The parameters a test reads and the attributes it reads of each: `args.fp16 and not x` ->
    [("args", ".fp16"), ("x", "")]."""
    found: List[Tuple[str, str]] = []
    inner: set = set()
    for node in ast.walk(test):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Attribute):
            parts: List[str] = []
            current: ast.AST = node
            while isinstance(current, ast.Attribute):
                inner.add(id(current))
                parts.append(current.attr)
                current = current.value
            if isinstance(current, ast.Name) and current.id in params:
                inner.add(id(current))
                found.append((current.id, "".join(f".{p}" for p in reversed(parts))))
        elif isinstance(node, ast.Name) and node.id in params:
            found.append((node.id, ""))
    return found


def setup_key(index: "ProjectIndex", path: str) -> str:
    """What of the index a setup-helper migration of the file at `path` depends on ("" if
    nothing): the bytes of every file importing a file that calls `amp.initialize` (a new caller
    of a helper, an inference use among them, flips every side's decision)."""
    facts = index.modules.get(os.path.abspath(path))
    if facts is None or not (facts.apex_init_function or facts.apex_step_functions):
        return ""
    cached = index.__dict__.get("_apex_setup_digest")
    if cached is None:
        parts: List[str] = []
        for helper in sorted(p for p, s in index.modules.items() if s.apex_init_function and p in index.apex_sources):
            for importer, _ in importers(index, helper):
                parts.append(repr((helper, importer, index.digests.get(importer))))
        cached = hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest() if parts else ""
        index.__dict__["_apex_setup_digest"] = cached
    return cached
