"""`model, optimizer = amp.initialize(model, optimizer, ...)` in a file that never trains with it.

Test and evaluation scripts copied from a training script keep its setup: they build an optimizer,
hand it to `amp.initialize`, and then only run the model (`validate(model, ...)`); no
`amp.scale_loss` follows, in this file or, through the optimizer, in another (the name
`initialize` returns is never read again). For apex the optimizer then plays no part: the call
is the inference `amp.initialize(model)`, and the planner's inference path takes it (each later
statement running the model under `torch.autocast`, or the call dropped with the reason). In a
file that also trains with another call, such a call is a companion setup of a second model (an
EMA copy), dropped as an inference call is (`_amp_migration._without_inference_inits`).

A literal `None` for the optimizers (`amp.initialize(model, None, ...)`) is apex's default and
needs no rule here (rules/apex/_amp_options.py reads it as no optimizers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.rules.apex._amp_options import INITIALIZE_PARAMS, bound_arguments

if TYPE_CHECKING:
    from ampmigrate.rules.apex._amp_common import AmpRef
    from ampmigrate.rules.apex._amp_migration import _Planner


def optimizers_unused(planner: "_Planner", init: "AmpRef") -> bool:
    """Whether `init` is `a, b = amp.initialize(a, b, ...)` whose optimizer name `b` nothing reads
    afterwards: in its function (not in a loop, so no earlier line runs again after it), nor in
    another function (a global), nor in another file (imported from here); and the file scales
    no loss with apex. The optimizer must be made in that function (not a parameter: the caller
    would hold it too), and reach nothing before the call either, but a value nothing reads (a
    trainer built before `amp.initialize` and run after it holds the same, patched, object)."""
    if any(r.api not in (None, "initialize") for r in planner.refs):
        return False
    if not optimizer_never_read(planner, init):
        return False
    name = _optimizer_name(planner, init)
    planner._note(f"`{name}`, which `amp.initialize` returned, is not used again: the setup is inference")
    return True


def _optimizer_name(planner: "_Planner", init: "AmpRef") -> str:
    small = planner._init_line(init).body[0]
    return small.targets[0].target.elements[1].value.value


def optimizer_never_read(planner: "_Planner", init: "AmpRef") -> bool:
    """`a, b = amp.initialize(a, b, ...)` whose optimizer `b`, made in its function, nothing reads
    afterwards (see `optimizers_unused`), whatever else the file trains: a companion call, as
    MoCo's `model_ema, optimizer_ema = amp.initialize(model_ema, optimizer_ema)` with an
    optimizer of learning rate 0 built only to pass apex one."""
    call = init.call
    line = planner._init_line(init)
    small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or small.value is not call:
        return False
    target = small.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
        return False
    model, optimizer = (e.value for e in target.elements)
    if not (isinstance(model, cst.Name) and isinstance(optimizer, cst.Name)) or model.value == optimizer.value:
        return False
    home = planner._function_scope(call)
    if home.kind not in ("function", "module"):
        return False
    name = optimizer.value
    given = (bound_arguments(call, INITIALIZE_PARAMS) or {}).get("optimizers")
    if given is None or not (isinstance(given.value, cst.Name) and given.value.value == name):
        return False  # the object handed to apex is another name's, which may reach a trainer
    if home.kind == "module" and name in planner.ctx.imported_elsewhere:
        return False
    root = home.node if home.kind == "function" else planner.module
    for ancestor in planner.names.ancestors(line):
        if ancestor is root:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            return False
    after = planner.ctx.position(line).end.line  # past the statement (its own arguments read the name)
    if home.kind == "function" and name in {p.name.value for p in _params(home.node)}:
        return False  # the caller holds the optimizer too, and may train with it
    made = False
    for node in walk(root, into_scopes=True):
        if isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == name for n in node.names):
            return False
        if not isinstance(node, cst.Name) or node.value != name or node is optimizer:
            continue
        if planner._line(node) > after:
            if _zero_grad_only(planner, node, home):
                continue
            return False  # read (or bound again) after the call: its use may be training
        if planner._function_scope(node) is not home:
            return False  # a function or lambda of its own may read it later
        if any(a is line for a in planner.names.ancestors(node)):
            continue  # an argument of `amp.initialize` itself
        parent = planner.names.parent(node)
        if isinstance(parent, cst.AssignTarget) and isinstance(planner.names.parent(parent), cst.Assign):
            made = True  # `optimizer = build_optimizer(...)`
            continue
        if not _dead_argument(planner, root, node):
            return False  # handed to something that may keep it (a trainer built before `initialize`)
    return made


def _zero_grad_only(planner: "_Planner", node: cst.Name, home) -> bool:
    """`optimizer.zero_grad()` as a statement of its own in the function (an evaluation script
    copied from its training script clears gradients it never computes): no training."""
    attribute = planner.names.parent(node)
    call = planner.names.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    expr = planner.names.parent(call) if isinstance(call, cst.Call) else None
    return (
        isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "zero_grad"
        and isinstance(call, cst.Call) and call.func is attribute and isinstance(expr, cst.Expr)
        and planner._function_scope(node) is home
    )


def _params(func: cst.FunctionDef):
    p = func.params
    return [*p.posonly_params, *p.params, *p.kwonly_params, *[x for x in (p.star_arg, p.star_kwarg) if isinstance(x, cst.Param)]]


def _dead_argument(planner: "_Planner", root: cst.CSTNode, node: cst.Name) -> bool:
    """`node` is an argument of a call whose result goes to a name nothing reads
    (`scheduler = make_scheduler(cfg, optimizer)` in a script that never steps it): the optimizer
    object reaches nothing that runs later."""
    arg = planner.names.parent(node)
    call = planner.names.parent(arg) if isinstance(arg, cst.Arg) else None
    assign = planner.names.parent(call) if isinstance(call, cst.Call) else None
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return False
    target = assign.targets[0].target
    if not isinstance(target, cst.Name):
        return False
    if root is planner.module and target.value in planner.ctx.imported_elsewhere:
        return False
    for other in walk(root, into_scopes=True):
        if isinstance(other, (cst.Global, cst.Nonlocal)) and any(n.name.value == target.value for n in other.names):
            return False
        if isinstance(other, cst.Name) and other.value == target.value and other is not target:
            return False
    return True
