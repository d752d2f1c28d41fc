"""The one configuration where timm's NativeScaler clips other gradients than ApexScaler did.

timm's train.py (0.4 and later) calls the loss scaler with

    loss_scaler(loss, optimizer, clip_grad=args.clip_grad, clip_mode=args.clip_mode,
                parameters=model_parameters(model, exclude_head="agc" in args.clip_mode))

ApexScaler ignored `parameters` and clipped every parameter of the optimizer; NativeScaler
clips `parameters`, which leaves the classifier head out when `exclude_head` is true (adaptive
gradient clipping). Only runs that clip (`clip_grad` not None) with `exclude_head` true differ.
Rather than change those silently, the migrated apex arm raises for them, where apex was set up,
as the run-time opt level's O3 guard does (_amp_options.py); every other run is unchanged.

The guard reads the same values where the apex arm is: the names of the two expressions must be
parameters of the function calling the scaler, that function called once, from the apex arm's
function, with a name (bound once there, before the arm) for each; or, when the scaler is called
in the arm's own function, names bound once before the arm. An attribute they read (`args.clip_mode`)
must not be assigned anywhere in the file. Anything else: None, and the caller keeps its unsafe reason.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst

GUARD_MESSAGE = (  # two lines, no quote characters: spelled with the file's own quotes
    "under apex every parameter of the optimizer was clipped; with exclude_head (clip mode agc) ",
    "timm NativeScaler leaves the model head out: use another clip mode or clip by hand",
)


def agc_guard(planner, call: cst.Call, clip: cst.BaseExpression, head: cst.BaseExpression, arm_line) -> Optional[str]:
    """`if <clip> is not None and <head>: raise ValueError(...)`, spelled where `arm_line` (the
    apex arm's scaler line) is, or None when the values there cannot be shown to be the same."""
    names, ctx = planner.names, planner.ctx
    arm_scope = planner._function_scope(arm_line)
    caller_scope = planner._function_scope(call)
    arm_at = ctx.position(arm_line).start.line
    mapping: Dict[int, cst.BaseExpression] = {}
    loads = _name_loads(clip) + _name_loads(head)
    if not loads or _attributes_assigned(planner, clip, head):
        return None
    if caller_scope is arm_scope:
        for name in loads:
            if not _bound_once_before(planner, name, arm_at):
                return None
    else:
        site = _only_call_site(planner, caller_scope, arm_scope)
        if site is None:
            return None
        for name in loads:
            argument = _argument_for(planner, caller_scope, site, name)
            if argument is None or not _bound_once_before(planner, argument, arm_at):
                return None
            mapping[id(name)] = argument
    respelled = [ctx.code(_respell(e, mapping)).strip() for e in (clip, head)]
    if any("\n" in code for code in respelled):
        return None
    first, second = (ctx.string(part).value for part in GUARD_MESSAGE)
    return (
        f"if {respelled[0]} is not None and ({respelled[1]}):\n"
        f"    raise ValueError(\n        {first}\n        {second}\n    )\n"
    )


def _name_loads(expression: cst.BaseExpression) -> List[cst.Name]:
    """The names an expression reads (`args` in `"agc" in args.clip_mode`), not attribute names."""
    found: List[cst.Name] = []

    class _Loads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            found.append(cst.Name("lambda"))  # never a parameter: the guard is refused
            return False

    expression.visit(_Loads())
    return found


def _attributes_assigned(planner, *expressions: cst.BaseExpression) -> bool:
    """Does the file assign an attribute the expressions read (`args.clip_mode = ...`)?"""
    ctx = planner.ctx
    read = set()
    for expression in expressions:
        for node in _attribute_reads(expression):
            read.add(" ".join(ctx.code(node).split()))
    for target in planner.names.nodes_of_type((cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
        written = target.target
        if isinstance(written, cst.Attribute) and " ".join(ctx.code(written).split()) in read:
            return True
    return False


def _attribute_reads(expression: cst.BaseExpression) -> List[cst.Attribute]:
    found: List[cst.Attribute] = []

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            found.append(node)

    expression.visit(_Reads())
    return found


def _bound_once_before(planner, name: cst.BaseExpression, line: int) -> bool:
    """A plain name whose one binding (a parameter, or a statement before `line`) a load sees."""
    if not isinstance(name, cst.Name):
        return False
    bindings = planner.names.bindings_of(name)
    if len(bindings) != 1 or bindings[0].kind not in ("param", "assign"):
        return False
    return bindings[0].kind == "param" or planner.ctx.position(bindings[0].node).start.line < line


def _only_call_site(planner, callee_scope, arm_scope) -> Optional[cst.Call]:
    """The one call of the function `callee_scope` is, made in the arm's function."""
    function = callee_scope.node
    if not isinstance(function, cst.FunctionDef):
        return None
    names = planner.names
    defs = names.lookup(function.name.value, callee_scope.parent) if callee_scope.parent else []
    if len(defs) != 1 or defs[0].kind != "def":
        return None
    refs = names.references(defs[0])
    calls = [names.parent(r) for r in refs]
    if len(refs) != 1 or not isinstance(calls[0], cst.Call) or calls[0].func is not refs[0]:
        return None
    if planner._function_scope(calls[0]) is not arm_scope:
        return None
    return calls[0]


def _argument_for(planner, callee_scope, site: cst.Call, name: cst.Name) -> Optional[cst.BaseExpression]:
    """The argument `site` passes for the parameter `name` reads (a parameter bound once)."""
    bindings = planner.names.bindings_of(name)
    if len(bindings) != 1 or bindings[0].kind != "param" or bindings[0].scope is not callee_scope:
        return None
    params = callee_scope.node.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None or any(a.star for a in site.args):
        return None
    positional = [*params.posonly_params, *params.params]
    for index, arg in enumerate(a for a in site.args if a.keyword is None):
        if index < len(positional) and positional[index].name.value == name.value:
            return arg.value
    for arg in site.args:
        if arg.keyword is not None and arg.keyword.value == name.value:
            return arg.value
    return None  # the parameter's default: not followed


def _respell(expression: cst.BaseExpression, mapping: Dict[int, cst.BaseExpression]) -> cst.BaseExpression:
    """The expression with its parameters replaced by the caller's arguments, on one line (a copy
    of a call's argument wrapped over several lines)."""

    class _Respell(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return mapping.get(id(original), updated)

        def leave_ParenthesizedWhitespace(self, original, updated) -> cst.SimpleWhitespace:
            return cst.SimpleWhitespace(" ")

    return expression.visit(_Respell())
