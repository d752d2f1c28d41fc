"""`model, optimizer = amp.initialize(model, optimizer, ...)` in a file that never trains with it.

Test and evaluation scripts copied from a training script keep its setup: they build an optimizer,
hand it to `amp.initialize`, and then only run the model (`validate(model, ...)`); no
`amp.scale_loss` follows, in this file or, through the optimizer, in another (the name
`initialize` returns is never read again). For apex the optimizer then plays no part: the call
is the inference `amp.initialize(model)`, and the planner's inference path takes it (each later
statement running the model under `torch.autocast`, or the call dropped with the reason).

A literal `None` for the optimizers (`amp.initialize(model, None, ...)`) is apex's default and
needs no rule here (rules/apex/_amp_options.py reads it as no optimizers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ampmigrate.rules.apex._flow import walk

if TYPE_CHECKING:
    from ampmigrate.rules.apex._amp_common import AmpRef
    from ampmigrate.rules.apex._amp_migration import _Planner


def optimizers_unused(planner: "_Planner", init: "AmpRef") -> bool:
    """Whether `init` is `a, b = amp.initialize(a, b, ...)` whose optimizer name `b` nothing reads
    afterwards: in its function (not in a loop, so no earlier line runs again after it), nor in
    another function (a global), nor in another file (imported from here); and the file scales
    no loss with apex."""
    if any(r.api not in (None, "initialize") for r in planner.refs):
        return False
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
    if home.kind == "module" and name in planner.ctx.imported_elsewhere:
        return False
    root = home.node if home.kind == "function" else planner.module
    for ancestor in planner.names.ancestors(line):
        if ancestor is root:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            return False
    after = planner.ctx.position(line).end.line  # past the statement (its own arguments read the name)
    for node in walk(root, into_scopes=True):
        if isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == name for n in node.names):
            return False
        if not isinstance(node, cst.Name) or node.value != name or node is optimizer:
            continue
        if planner._line(node) > after:
            return False  # read (or bound again) after the call: its use may be training
        if planner._function_scope(node) is not home:
            return False  # a function or lambda of its own may read it later
    return True
