"""apex.amp's loss scaling for an input gradient, in a helper of another file (facts read with `ast`).

The shape (locuslab/fast_adversarial's `utils.attack_pgd`, copied into many adversarial-training
projects): a top-level function of module B takes the optimizer as an optional parameter and
scales the loss of its attack with it, never stepping it:

    def attack_pgd(model, X, y, epsilon, alpha, attack_iters, restarts, opt=None):
        ...
            if opt is not None:
                with amp.scale_loss(loss, opt) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            grad = delta.grad.detach()

A training script (A) that sets apex up and scales its own losses hands it the optimizer
(`attack_pgd(model, X, y, epsilon, alpha, 5, 1, opt)`, fast_adversarial's early stopping); B's
own evaluation calls it without one. apex scaled with the state `amp.initialize` gave the
optimizer; torch.amp's state is the GradScaler, so the migration threads A's scaler through: B's
function gains `scaler=None` (keyword-only) and scales with `scaler.scale(loss).backward()`, its
forward pass under `torch.autocast(..., enabled=scaler is not None and scaler.is_enabled())`; A
passes `scaler=scaler` in each call that gives the optimizer. The input gradient is scaled as it
was under apex (an attack reads its sign, or scales it back itself), and the parameters'
gradients it leaves are scaled by the same factor as the next scaled backward's until
`scaler.update()`: a step that would accumulate them unscales them together.

A call without the optimizer never reaches the scaler: every `amp.scale_loss` must be under
`if opt is not None:` (or `if opt:`), `opt` must default to None and be read nowhere else, and
B's own module may call the function only without it.
"""

from __future__ import annotations

import ast
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Set

if TYPE_CHECKING:
    from ampmigrate.engine.apex_threading import Decision
    from ampmigrate.engine.project_index import ProjectIndex


def input_gradient_problem(tree: ast.Module, function: ast.FunctionDef, optimizer: str, scales: List[ast.Attribute]) -> str:
    """Why `function`, which scales losses with its parameter `optimizer` and never steps it, is
    not the input-gradient shape above ("" when it is)."""
    name = function.name
    positional = [*function.args.posonlyargs, *function.args.args]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(function.args.defaults):], function.args.defaults))
    defaults.update({a.arg: d for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None})
    default = defaults.get(optimizer)
    if not (isinstance(default, ast.Constant) and default.value is None):
        return f"`{optimizer}.step()` is not called in `{name}()`, and `{optimizer}` is not optional (`{optimizer}=None`)"
    parents = _parents(function)
    guarded = set()
    for attribute in scales:
        if not _under_guard(attribute, optimizer, parents, function):
            return f"`{optimizer}.step()` is not called in `{name}()`, and `amp.scale_loss` is not under `if {optimizer} is not None:`"
        call = parents.get(id(attribute))
        if call is not None:
            guarded.update(id(arg) for arg in ast.walk(call))
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == optimizer and id(node) not in guarded and not _tested(node, parents):
            return f"`{name}()` uses `{optimizer}` otherwise than to scale the loss, which the GradScaler does not stand in for"
    names = [a.arg for a in positional]
    index = names.index(optimizer) if optimizer in names else -1
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            call = _called(tree, node)
            if call is None:
                return f"`{name}()` is also used in its own file otherwise than by calling it"
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                return f"`{name}()` is called with `*`/`**` arguments in its own file"
            if (0 <= index < len(call.args)) or any(k.arg == optimizer for k in call.keywords):
                return f"`{name}()` is called with an optimizer in its own file, where no GradScaler is made"
    return ""


def _parents(root: ast.AST) -> Dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(root) for child in ast.iter_child_nodes(parent)}


def _is_guard(test: ast.expr, optimizer: str) -> bool:
    """`opt is not None`, `opt`, `None is not opt`."""
    if isinstance(test, ast.Name):
        return test.id == optimizer
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot):
        sides = [test.left, test.comparators[0]]
        names = [s for s in sides if isinstance(s, ast.Name) and s.id == optimizer]
        nones = [s for s in sides if isinstance(s, ast.Constant) and s.value is None]
        return len(names) == 1 and len(nones) == 1
    return False


def _under_guard(node: ast.AST, optimizer: str, parents: Dict[int, ast.AST], root: ast.AST) -> bool:
    child = node
    parent = parents.get(id(child))
    while parent is not None and parent is not root:
        if isinstance(parent, ast.If) and any(s is child for s in parent.body) and _is_guard(parent.test, optimizer):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        child, parent = parent, parents.get(id(parent))
    return False


def _tested(node: ast.Name, parents: Dict[int, ast.AST]) -> bool:
    """`node` is (part of) the test of an `if` guarding the scaled backward."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Compare):
        parent = parents.get(id(parent))
        return isinstance(parent, ast.If) and isinstance(parent.test, ast.Compare) and _is_guard(parent.test, node.id)
    return isinstance(parent, ast.If) and parent.test is node


def _called(tree: ast.Module, name: ast.Name) -> Optional[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.func is name:
            return node
    return None


def decide_input_gradient(index: "ProjectIndex", path: str, function: str) -> "Decision":
    """`decide` (engine/apex_threading.py) for an input-gradient function of the file at `path`:
    every file of the run using it must call it only with the optimizer its own `amp.initialize`
    returned, in the parameter the function scales with (each such file then passes its
    GradScaler); a file without `amp.initialize`, or calling it otherwise, stops both sides."""
    from ampmigrate.engine.apex_threading import Decision, followed_uses

    absolute = os.path.abspath(path)
    summary = index.modules[absolute]
    positional, optimizer, scaler, problem = summary.apex_step_functions[function]
    here = index.relative(absolute)
    if problem:
        return Decision(False, f"in {here}: {problem}")
    callers: List[str] = []
    paths: List[str] = []
    for other, _, found, refusal in followed_uses(index, absolute, function):
        if refusal:
            return Decision(False, refusal)
        where = index.relative(other)
        slot = positional.index(optimizer) if optimizer in positional else -1
        given_one = [c for c in found.calls if c.unpacks or 0 <= slot < c.positional or optimizer in c.keywords]
        if not given_one:
            continue  # every call leaves the optimizer out: it is None there, and no scaler is reached
        facts = index.modules[other]
        calls = [c for c in facts.apex_gradient_calls if c[0] in found.spellings]
        if not calls:
            return Decision(
                False, f"{where} hands `{function}()` an optimizer, but not from the function calling its "
                "`amp.initialize`, after it, in a file that also scales its own losses: the one shape whose GradScaler "
                "is passed on"
            )
        for _, line, position, keyword in calls:
            given = keyword or (positional[position] if 0 <= position < len(positional) else "")
            if given != optimizer:
                return Decision(
                    False, f"{where}:{line} passes the optimizer to `{function}()` as `{given or '*'}`, not as "
                    f"`{optimizer}`, the parameter it scales with"
                )
        if {c[1] for c in calls} != {c.line for c in given_one}:
            return Decision(
                False, f"{where} hands `{function}()` another optimizer than the one its `amp.initialize` returns"
            )
        callers.append(where)
        paths.append(other)
    if not callers:
        return Decision(False, f"no file of the run hands `{function}()` of {here} the optimizer of its `amp.initialize`")
    return Decision(True, "", optimizer, scaler, tuple(callers), tuple(paths))


def optimizer_calls(function: ast.AST, after_line: int, optimizer: str, skip: Set[str]) -> List[tuple]:
    """The calls in `function`'s own body after line `after_line` that pass the name `optimizer`:
    (callee, line, position or -1, keyword or ""); callees in `skip` (apex's own) aside."""
    from ampmigrate.engine.apex_threading import _own_nodes
    from ampmigrate.engine.caller_uses import dotted

    found = []
    for node in _own_nodes(function):
        if not (isinstance(node, ast.Call) and dotted(node.func) and node.lineno > after_line):
            continue
        callee = dotted(node.func)
        if callee.partition(".")[0] in skip:
            continue
        for position, arg in enumerate(node.args):
            if isinstance(arg, ast.Name) and arg.id == optimizer:
                found.append((callee, node.lineno, position, ""))
        for keyword in node.keywords:
            if keyword.arg and isinstance(keyword.value, ast.Name) and keyword.value.id == optimizer:
                found.append((callee, node.lineno, -1, keyword.arg))
    return sorted(found, key=lambda item: item[1])
