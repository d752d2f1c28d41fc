"""`amp.load_state_dict(state)` becomes the GradScaler's load, guarded by the state's layout.

A checkpoint saved by apex holds `{"loss_scaler0": {"loss_scale", "unskipped"}}`, which
`GradScaler.load_state_dict` rejects (KeyError: 'scale'): resuming from it must keep working,
with the scaler at its initial scale. So the state is loaded only when it has GradScaler's
layout (a `scale` key). Used by the in-file migration and by a checkpoint helper of another
file that receives the scaler in place of apex's module (_state_params_elsewhere.py).
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.engine.context import FileContext, FixBuilder
from ampmigrate.rules.apex._amp_common import Unfixable

GUARD_NOTE = (
    "the scaler state is loaded only when it has GradScaler's layout: a checkpoint saved by apex "
    "(`loss_scaler0`) resumes with the scaler at its initial scale"
)


def guard_state_load(ctx: FileContext, builder: FixBuilder, call: cst.Call, scaler: str, spelled: str, when: str = "") -> None:
    """Rewrite the statement `<spelled>(state)` (the call `call`) into `if "scale" in state:
    <scaler>.load_state_dict(state)`; raises Unfixable where the statement has another shape.
    `when`: a test that must hold first (`scaler is not None` where the scaler may be missing)."""
    first = f"{when} and " if when else ""
    names = ctx.names
    expr = names.parent(call)
    line = names.parent(expr) if isinstance(expr, cst.Expr) else None
    where = ctx.position(call).start.line
    if isinstance(line, cst.SimpleStatementSuite) and _in_one_line_if(ctx, builder, call, line, scaler, first):
        return
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or len(call.args) != 1 or call.args[0].keyword or call.args[0].star:
        raise Unfixable(
            f"`{spelled}` at line {where} is not a statement of its own with one argument; "
            "a checkpoint saved by apex needs its state checked before it is loaded"
        )
    state = call.args[0].value
    code = ctx.code(state).strip()
    scale = ctx.string("scale").value
    prefix = ""
    if not side_effect_free(state):
        name = "amp_state"
        if names.lookup(name, names.scope_of(call)):
            raise Unfixable(f"`{spelled}` at line {where}: the name `{name}` is taken")
        prefix, code = f"{name} = {code}\n", name
    text = f"{prefix}if {first}{scale} in {code}:  # a GradScaler state; apex saved `loss_scaler0` instead\n    {scaler}.load_state_dict({code})\n"
    statements = list(cst.parse_module(text, config=ctx.module.config_for_parsing).body)
    statements[0] = statements[0].with_changes(leading_lines=line.leading_lines)
    builder.replace(line, cst.FlattenSentinel(statements))


def _in_one_line_if(ctx: FileContext, builder: FixBuilder, call: cst.Call, suite: cst.SimpleStatementSuite, scaler: str, first: str = "") -> bool:
    """`if "amp" in ckpt: amp.load_state_dict(ckpt["amp"])` on one line: the layout check joins
    the `if`'s test (evaluated after it, as the load was)."""
    owner = ctx.names.parent(suite)
    if not (
        isinstance(owner, cst.If)
        and owner.body is suite
        and owner.orelse is None
        and len(suite.body) == 1
        and len(call.args) == 1
        and not call.args[0].keyword
        and not call.args[0].star
        and side_effect_free(call.args[0].value)
    ):
        return False
    test = ctx.code(owner.test).strip()
    if isinstance(owner.test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)):
        test = f"({test})"
    state = ctx.code(call.args[0].value).strip()
    builder.replace(owner.test, ctx.parse_expression(f"{test} and {first}{ctx.string('scale').value} in {state}"))
    builder.replace(call.func, ctx.parse_expression(f"{scaler}.load_state_dict"))
    return True


def side_effect_free(node: cst.BaseExpression) -> bool:
    """A name, attribute or constant-key subscript chain: evaluating it twice reads the same."""
    while True:
        if isinstance(node, cst.Name):
            return True
        if isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript) and len(node.slice) == 1:
            index = node.slice[0].slice
            if not (isinstance(index, cst.Index) and isinstance(index.value, (cst.SimpleString, cst.Integer, cst.Name))):
                return False
            node = node.value
        else:
            return False
