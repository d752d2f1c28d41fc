"""Calls of a training function that never reach its scaled backward: they need no GradScaler.

Kaggle's one-function loops (`run_nn(cfg, mode, model, loader, criterion=None, optim=None,
apex=None)`, called by `train()` after `amp.initialize` and by `valid()`/`test()` with
`mode="valid"`): the scaler is threaded to the function as `scaler=None`, passed by the calls that
train; a call that is not threaded keeps its arguments when every scaled backward, step and other
apex use of the function sits under one `if` that call cannot enter. That is read from the call's
literal arguments (and the defaults of those it does not give): `if mode in ["train"]:` with
`mode="valid"`, `if apex:` with `apex` left at `None`; a test may also read a local the function
binds once, at its top level, from such an expression of parameters that are never rebound
(MadryLab robustness' `is_train = (loop_type == 'train')`, then `if is_train:`). Anything else that
is unknown (a variable argument, a test that calls something) keeps the old refusal.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from ampmigrate.rules.apex._amp_options import literal_value

_UNKNOWN = object()


def scalerless_calls(planner, scope, caller) -> Optional[List[cst.Call]]:
    """The calls of `scope`'s function made in `caller`, when none of them reaches a use of the
    scaler in it; None when one may (or a call cannot be read)."""
    names = planner.names
    function = scope.node
    guards = _common_guards(planner, scope)
    if not guards:
        return None
    found: List[cst.Call] = []
    for binding in scope.parent.bindings.get(function.name.value, []):
        for ref in names.references(binding):
            call = names.parent(ref)
            if planner._function_scope(call) is not caller:
                continue
            values = argument_values(function, call)
            if values is not None:
                # a parameter the function rebinds (`mode = mode.lower()`) may differ at the test
                values = {k: v if len(scope.bindings.get(k, [])) == 1 else _UNKNOWN for k, v in values.items()}
                values.update(_derived_locals(scope, values))
            if values is None or not any(evaluate(test, values) is (not taken) for test, taken in guards):
                return None
            found.append(call)
    return found or None


def _uses(planner, scope) -> List[cst.CSTNode]:
    """The nodes of the function that need the scaler: its apex uses and the steps of the
    optimizers it scales with."""
    uses = [
        r.node for r in planner.refs
        if r.api not in (None, "pass", "carry", "initialize", "init") and planner._function_scope(r.node) is scope
    ]
    optimizers: Set[str] = set()
    for ref in planner.refs:
        if ref.api in ("scale_loss", "handle.scale_loss") and ref.call is not None and len(ref.call.args) > 1:
            optimizers.add(planner.ctx.code(ref.call.args[1].value).strip())
    for call in planner.names.nodes_of_type(cst.Call):
        func = call.func
        if (
            isinstance(func, cst.Attribute) and func.attr.value == "step"
            and planner.ctx.code(func.value).strip() in optimizers and planner._function_scope(call) is scope
        ):
            uses.append(call)
    return uses


def _common_guards(planner, scope) -> List[tuple]:
    """(test, taken) of each `if` of the function every use of the scaler lies under."""
    uses = _uses(planner, scope)
    if not uses:
        return []
    common: Optional[Dict[int, tuple]] = None
    for node in uses:
        here: Dict[int, tuple] = {}
        for branch in planner._branches(node, scope.node):
            here[id(branch.statement)] = (branch.test, branch.taken)
        common = here if common is None else {k: v for k, v in common.items() if k in here and here[k][1] == v[1]}
    return list((common or {}).values())


def argument_values(function: cst.FunctionDef, call: cst.Call, method: bool = False) -> Optional[Dict[str, object]]:
    """{parameter: the literal value the call gives it (or its default)}; `_UNKNOWN` for a value
    that is not a literal; None when the call unpacks arguments. `method`: a call through the
    instance, which gives no value for the first parameter."""
    params = function.params
    if params.posonly_params or isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
        return None
    positional = list(params.params)[1:] if method else list(params.params)
    values: Dict[str, object] = {}
    for param in (*positional, *params.kwonly_params):
        values[param.name.value] = _literal(param.default) if param.default is not None else _UNKNOWN
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value not in values:
                return None
            values[arg.keyword.value] = _literal(arg.value)
        elif index < len(positional):
            values[positional[index].name.value] = _literal(arg.value)
        else:
            return None
    return values


def _derived_locals(scope, values: Dict[str, object]) -> Dict[str, object]:
    """{local: its value} for the locals bound once, by a top-level `name = <expression>` of the
    function, from parameters bound nowhere else (`is_train = (loop_type == 'train')`)."""
    derived: Dict[str, object] = {}
    for statement in scope.node.body.body:
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            continue
        assign = statement.body[0]
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)):
            continue
        name = assign.targets[0].target.value
        if name in values or len(scope.bindings.get(name, [])) != 1:
            continue
        reads = {n.value for n in _names(assign.value)} - {"True", "False", "None"}
        if not reads or any(r not in values or len(scope.bindings.get(r, [])) != 1 for r in reads):
            continue
        known = {**values, **derived}
        value = evaluate(assign.value, known)
        derived[name] = value if value is not _UNKNOWN else _value(assign.value, known)
    return derived


def _names(node: cst.CSTNode) -> List[cst.Name]:
    found: List[cst.Name] = []

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            found.append(cst.Name("__attribute__"))  # `args.train`: not a plain parameter
            return False

    node.visit(_Collect())
    return found


def _literal(node: cst.BaseExpression) -> object:
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        items = [_literal(e.value) for e in node.elements if not isinstance(e, (cst.StarredElement,))]
        if len(items) != len(node.elements) or any(i is _UNKNOWN for i in items):
            return _UNKNOWN
        return tuple(items)
    try:
        return literal_value(node)
    except ValueError:
        return _UNKNOWN


def evaluate(test: cst.BaseExpression, values: Dict[str, object]) -> object:
    """True/False where the test's value follows from the parameters' literal values; else
    `_UNKNOWN`. Only names of parameters, literals, `not`, `and`/`or` and comparisons."""
    if isinstance(test, cst.Name) and test.value in values:
        value = values[test.value]
        return _UNKNOWN if value is _UNKNOWN else bool(value)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = evaluate(test.expression, values)
        return _UNKNOWN if inner is _UNKNOWN else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = evaluate(test.left, values), evaluate(test.right, values)
        if isinstance(test.operator, cst.And):
            if left is False or right is False:
                return False
            return True if left is True and right is True else _UNKNOWN
        if left is True or right is True:
            return True
        return False if left is False and right is False else _UNKNOWN
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        left = _value(test.left, values)
        right = _value(test.comparisons[0].comparator, values)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        operator = test.comparisons[0].operator
        try:
            if isinstance(operator, cst.In):
                return left in right
            if isinstance(operator, cst.NotIn):
                return left not in right
            if isinstance(operator, cst.Equal):
                return left == right
            if isinstance(operator, cst.NotEqual):
                return left != right
            if isinstance(operator, cst.Is):
                return left is right if right is None or left is None else _UNKNOWN
            if isinstance(operator, cst.IsNot):
                return left is not right if right is None or left is None else _UNKNOWN
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN


def _value(node: cst.BaseExpression, values: Dict[str, object]) -> object:
    if isinstance(node, cst.Name) and node.value in values:
        return values[node.value]
    return _literal(node)
