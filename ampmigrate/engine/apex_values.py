"""apex's amp module reached through a value: the `ast` facts the project index keeps.

Real apex code does not always name apex where it uses it. A helper imports the module and
returns it (nlp-recipes' `get_amp(fp16)`: `from apex import amp` under `if fp16:`, else
`amp = None`, then `return amp`), and training code elsewhere runs `amp = get_amp(fp16)` and
`amp.initialize(...)`. The helper's file records the function here (`apex_amp_getters`); the
rule (rules/apex/amp_from_helper.py) reports the uses of what a call of it returns.

A getter is recorded only when every value it can return is apex's amp module or `None`: every
`return` (of the function itself, not of a nested one) returns `None` or a name that the
function binds only by importing apex's amp or by assigning `None`, at least one return is the
module, and the function neither yields nor declares the name `global`/`nonlocal`.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set, Tuple

import ast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def apex_amp_getters(tree: ast.Module) -> List[str]:
    """Top-level functions of `tree` whose every return value is apex's amp module or None."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _returns_apex_amp(node):
            found.append(node.name)
    return found


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `function`'s body, not descending into nested functions, lambdas, classes."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _returns_apex_amp(function: ast.AST) -> bool:
    own = list(_own_nodes(function))
    if any(isinstance(node, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)) for node in own):
        return False
    kinds = binding_kinds(own, _parameters(function))
    module_returned = False
    for node in own:
        if not isinstance(node, ast.Return) or node.value is None or _is_none(node.value):
            continue
        if not (isinstance(node.value, ast.Name) and _only_apex_amp(kinds.get(node.value.id, set()))):
            return False
        module_returned = True
    return module_returned


def _only_apex_amp(bound: Set[str]) -> bool:
    """Bound to apex's amp module, and otherwise only to None."""
    return "amp" in bound and bound <= {"amp", "none"}


def _parameters(function: ast.AST) -> List[str]:
    params = function.args
    every = [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]
    return [arg.arg for arg in every if arg is not None]


def binding_kinds(nodes: List[ast.AST], params: List[str] = ()) -> Dict[str, Set[str]]:
    """What each name `nodes` bind is bound to: "amp" (an import of apex's amp module), "none"
    (`x = None`, `x, y = None, None`) or "other" (a parameter, any other store)."""
    kinds: Dict[str, Set[str]] = {name: {"other"} for name in params}
    stores: Dict[str, int] = {}
    nones: Dict[str, int] = {}
    for node in nodes:
        if isinstance(node, _SCOPES) and not isinstance(node, ast.Lambda):
            kinds.setdefault(node.name, set()).add("other")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                amp = node.module == "apex" and not node.level and alias.name == "amp"
                kinds.setdefault(alias.asname or alias.name, set()).add("amp" if amp else "other")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                amp = alias.name == "apex.amp" and alias.asname is not None
                kinds.setdefault(alias.asname or alias.name.split(".")[0], set()).add("amp" if amp else "other")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            for target, value in _pairs(node.targets[0], node.value):
                if isinstance(target, ast.Name) and _is_none(value):
                    nones[target.id] = nones.get(target.id, 0) + 1
    for name, count in stores.items():
        kinds.setdefault(name, set()).add("none" if nones.get(name, 0) == count else "other")
    return kinds


def _pairs(target: ast.expr, value: ast.expr):
    """(target, value) of an assignment, element-wise for `a, b = x, y`."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
        if len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
            return list(zip(target.elts, value.elts))
        return []
    return [(target, value)]


def _is_none(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


# --------------------------------------------------------------------------------------------
# A function that receives apex's amp module only to save or restore its state (neural_sp's
# `load_checkpoint(path, model=None, scheduler=None, amp=None)`: `if amp is not None:
# amp.load_state_dict(...)`), called from a file that passes its `amp` there by keyword or
# position. The parameter must be used for nothing else: a `model` parameter that is also moved,
# wrapped or returned is never taken for apex's module, and the caller must hand apex's module to
# that very parameter (the index matches keyword or position, engine/project_index.py).
STATE_APIS = frozenset({"state_dict", "load_state_dict", "master_params"})


def apex_state_params(tree: ast.Module) -> Dict[str, List[Tuple[str, int]]]:
    """{function or "Class.method": [(parameter, its position or -1 for keyword-only)]} for the
    parameters a function uses only as `p.state_dict()`, `p.load_state_dict(...)`,
    `p.master_params(...)` and in `p is None` / `if p:` tests (at least one such call), or hands on
    only to such a parameter of a top-level function of the same file (hqa's
    `dump_checkpoint_on_kill(..., amp)` whose signal handler calls `save_checkpoint(..., amp, ...)`)."""
    found: Dict[str, List[Tuple[str, int]]] = {}
    functions = list(top_functions(tree))
    for _ in range(4):  # relays of relays: a few rounds reach every chain a file writes
        relays = {name: params for name, params in found.items() if "." not in name}
        current: Dict[str, List[Tuple[str, int]]] = {}
        for owner, function in functions:
            params = function_state_params(function, method=bool(owner), relays=relays)
            if params:
                current[f"{owner}.{function.name}" if owner else function.name] = params
        if current == found:
            break
        found = current
    return found


def function_state_params(
    function: ast.FunctionDef, method: bool, relays: Optional[Dict[str, List[Tuple[str, int]]]] = None
) -> List[Tuple[str, int]]:
    """`apex_state_params` of one function: (parameter, its position in the `def`, `self`
    counted, or -1 for keyword-only); a method's first parameter is never one. `relays`: the
    top-level functions of the same file with such parameters, which it may hand one on to."""
    positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    keyword_only = [a.arg for a in function.args.kwonlyargs]
    candidates = set(positional) | set(keyword_only)
    if method and positional:
        candidates.discard(positional[0])  # `self`
    if not candidates:
        return []
    parents: Dict[ast.AST, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    called: Set[str] = set()
    rejected: Set[str] = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Name) and node.id in candidates):
            continue
        if node.id in rejected:
            continue
        use = _state_use(node, parents)
        if use is None and relays and _relayed(node, parents, relays):
            use = True
        if use is None:
            rejected.add(node.id)
        elif use:
            called.add(node.id)
    return [
        (name, positional.index(name) if name in positional else -1)
        for name in [*positional, *keyword_only]
        if name in called and name not in rejected
    ]


def _relayed(node: ast.Name, parents: Dict[ast.AST, ast.AST], relays: Dict[str, List[Tuple[str, int]]]) -> bool:
    """`node` is an argument of a call of a top-level function of the file (`save_checkpoint(...,
    amp, ...)`) in the position or keyword of one of its state parameters."""
    call = parents.get(node)
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in relays):
        keyword = call if isinstance(call, ast.keyword) else None
        call = parents.get(keyword) if keyword is not None else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in relays):
            return False
        return any(param == keyword.arg for param, _ in relays[call.func.id])
    if any(isinstance(a, ast.Starred) for a in call.args):
        return False
    position = next((i for i, a in enumerate(call.args) if a is node), None)
    return position is not None and any(index == position for _, index in relays[call.func.id])


def _state_use(node: ast.Name, parents: Dict[ast.AST, ast.AST]) -> Optional[bool]:
    """True for `p.<state api>(...)`, False for a test of `p` (`p is None`, `if p:`), None for
    any other use (stored, passed, rebound, another attribute) of the name `node`."""
    if not isinstance(node.ctx, ast.Load):
        return None
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.value is node:
        call = parents.get(parent)
        return True if parent.attr in STATE_APIS and isinstance(call, ast.Call) and call.func is parent else None
    if isinstance(parent, ast.Compare):
        nones = [c for c in parent.comparators if isinstance(c, ast.Constant) and c.value is None]
        if parent.left is node and len(nones) == 1 and isinstance(parent.ops[0], (ast.Is, ast.IsNot)):
            return False
        return None
    child: ast.AST = node
    while isinstance(parent, (ast.BoolOp, ast.UnaryOp)):
        if isinstance(parent, ast.UnaryOp) and not isinstance(parent.op, ast.Not):
            return None
        child, parent = parent, parents.get(parent)
    if isinstance(parent, (ast.If, ast.IfExp, ast.While, ast.Assert)) and parent.test is child:
        return False
    return None


def top_functions(tree: ast.Module):
    """(class name or "", function) for each top-level function and each direct method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield "", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node.name, item


def apex_amp_args(tree: ast.Module, dotted) -> List[Tuple[str, int, int, str]]:
    """Calls handing apex's amp module to a parameter: (callee as written, line, the argument's
    position or -1, its keyword or ""). The argument is a name that, where the call is, is bound
    only by imports of apex's amp module (and to None): a local, a `global` (bound in any
    function declaring it) or a module-level name; a parameter or any other value never counts."""
    found: List[Tuple[str, int, int, str]] = []
    for nodes, resolve in name_scopes(tree):
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            callee = dotted(node.func)
            if not callee:
                continue
            for position, value in enumerate(node.args):
                if isinstance(value, ast.Starred):
                    break  # positions after a `*args` are unknown
                if isinstance(value, ast.Name) and _only_apex_amp(resolve(value.id)):
                    found.append((callee, node.lineno, position, ""))
            for keyword in node.keywords:
                if keyword.arg and isinstance(keyword.value, ast.Name) and _only_apex_amp(resolve(keyword.value.id)):
                    found.append((callee, node.lineno, -1, keyword.arg))
    found.sort(key=lambda item: (item[1], item[2], item[3]))
    return found


def name_scopes(tree: ast.Module):
    """(the nodes of one scope, `resolve(name)`: the kinds (`binding_kinds`) the name has there)
    for the module's top level and each function: a local, a `global` (bound in any function
    declaring it) or a module-level name; a closure's name is "other"."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    own = {function: list(_own_nodes(function)) for function in functions}
    module_nodes = list(_own_nodes(tree))
    module_kinds = binding_kinds(module_nodes)
    declared: Dict[ast.AST, Set[str]] = {}
    enclosing: Dict[ast.AST, Optional[ast.AST]] = {}
    for function in functions:
        declared[function] = {name for node in own[function] if isinstance(node, ast.Global) for name in node.names}
        local = binding_kinds(own[function])
        for name in declared[function]:
            module_kinds.setdefault(name, set()).update(local.get(name, set()))
        for node in own[function]:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                enclosing[node] = function
    scopes = [(module_nodes, lambda name: module_kinds.get(name, set()))]
    kinds = {function: binding_kinds(own[function], _parameters(function)) for function in functions}
    for function in functions:

        def resolve(name, function=function):
            if name in declared[function]:
                return module_kinds.get(name, set())
            if name in kinds[function]:
                return kinds[function][name]
            outer = enclosing.get(function)
            while outer is not None:
                if name in kinds[outer]:
                    return {"other"}  # a closure's name: not followed
                outer = enclosing.get(outer)
            return module_kinds.get(name, set())

        scopes.append((own[function], resolve))
    return scopes
