"""What the AMP3 rules share: reading statements around a protocol event, and spelling fixes."""

from __future__ import annotations

import ast
from typing import Callable, Optional, Sequence

import libcst as cst

from ampmigrate.analysis import flow, statements
from ampmigrate.analysis.scaler_protocol import (
    BACKWARD,
    OPAQUE,
    PLAIN_STEP,
    SCALED_BACKWARD,
    STEP,
    UNSCALE,
    UPDATE,
    ZERO_GRAD,
    EventReader,
    OptimizerKey,
)
from ampmigrate.analysis.scaler_typing import has_protocol_shape
from ampmigrate.api import ANY_GRAD_SCALER
from ampmigrate.engine.ast_nodes import memo, nodes_of
from ampmigrate.engine.names import NameIndex
from ampmigrate.rules.base import Rule

TRIGGERS = (r"GradScaler",)  # every scaler of a file is made from (or annotated as) a GradScaler class
SCALER_PREFIXES = tuple(sorted(ANY_GRAD_SCALER))  # ... and so the file reaches one of them


class ProtocolRule(Rule):
    """A rule that reads the protocol analysis, which also knows scalers only by their use
    (analysis/scaler_typing.py): a file may name no GradScaler class at all."""

    triggers = (*TRIGGERS, r"\.scale\(")

    def screen(self, tree: ast.Module) -> bool:
        return _may_hold_scaler(tree)


def _may_hold_scaler(tree: ast.Module) -> bool:
    # One answer per tree: five rules ask in a row.
    return memo(tree, "may hold a scaler", lambda t: _names_grad_scaler(t) or has_protocol_shape(t))


def _names_grad_scaler(tree: ast.Module) -> bool:
    """Some identifier, imported name or string annotation spells a GradScaler class. (A string
    elsewhere, a docstring or a Sphinx cross-reference, names nothing for the resolver.)"""
    return (
        any("GradScaler" in node.id for node in nodes_of(tree, ast.Name))
        or any("GradScaler" in node.attr for node in nodes_of(tree, ast.Attribute))
        or any("GradScaler" in node.name for node in nodes_of(tree, ast.alias))
        or any(_spells_grad_scaler(annotation) for annotation in _annotations(tree))
    )


def _annotations(tree: ast.Module):
    """Every annotation of the tree: parameters', annotated assignments' and return types."""
    for argument in nodes_of(tree, ast.arg):
        if argument.annotation is not None:
            yield argument.annotation
    for assign in nodes_of(tree, ast.AnnAssign):
        yield assign.annotation
    for kind in (ast.FunctionDef, ast.AsyncFunctionDef):
        for function in nodes_of(tree, kind):
            if function.returns is not None:
                yield function.returns


def _spells_grad_scaler(annotation: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Constant) and isinstance(node.value, str) and "GradScaler" in node.value
        for node in ast.walk(annotation)
    )


def callee(call: cst.Call) -> cst.CSTNode:
    """Where a finding about a call is reported: the callee (`torch.nn.utils.clip_grad_norm_`)."""
    return call.func


def call_statement(names: NameIndex, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
    """The line `call` is alone on (`scaler.update()`), if it is, inside a block we can edit."""
    expr = names.parent(call)
    line = names.parent(expr) if isinstance(expr, cst.Expr) else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or line.body[0] is not expr:
        return None
    return line if in_block(names, line) else None


def in_block(names: NameIndex, statement: cst.CSTNode) -> bool:
    block, _ = statements.block_of(names, statement)
    return block is not None and isinstance(names.parent(statement), (cst.IndentedBlock, cst.Module))


def simple_expression(expr: Optional[cst.BaseExpression]) -> bool:
    """Names, attribute chains and constant subscripts: safe to spell again elsewhere."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return simple_expression(expr.value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        index = expr.slice[0].slice
        return (
            isinstance(index, cst.Index)
            and isinstance(index.value, (cst.Integer, cst.SimpleString))
            and simple_expression(expr.value)
        )
    return False


def step_classifier(reader: EventReader, optimizer: OptimizerKey) -> Callable[[cst.CSTNode], Optional[str]]:
    """For `flow.reaches`: `scaler.step(optimizer)` is the goal; anything that would make an
    `unscale_(optimizer)` inserted before it wrong (another backward, an update, a zero_grad, a
    second unscale_, a call we cannot see into) ends the path."""

    def classify(unit: cst.CSTNode) -> Optional[str]:
        for event in reader.of(unit):
            if event.kind == STEP and event.optimizer == optimizer:
                return flow.HIT
            if event.kind in (BACKWARD, SCALED_BACKWARD, UPDATE, OPAQUE, ZERO_GRAD):
                return flow.STOP
            if event.kind in (UNSCALE, PLAIN_STEP) and event.optimizer == optimizer:
                return flow.STOP
        return None

    return classify


def line_of(ctx, code: str) -> cst.SimpleStatementLine:
    statement = ctx.parse_statement(code)
    assert isinstance(statement, cst.SimpleStatementLine), code
    return statement


def moved(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`statement` for re-insertion elsewhere: its comments go along, its blank lines do not."""
    return statement.with_changes(leading_lines=[line for line in statement.leading_lines if line.comment is not None])


def direct_statements(block: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return block.body if isinstance(block, cst.IndentedBlock) else ()


def remove_statement(fix, names: NameIndex, statement: cst.SimpleStatementLine, keep_clear: cst.CSTNode = None) -> None:
    """Remove `statement`; the blank lines above it stay, on the statement that follows (unless
    that one is `keep_clear`, which the same fix changes inside)."""
    fix.remove(statement)
    blank = []
    for line in statement.leading_lines:
        if line.comment is not None:
            break
        blank.append(line)
    if not blank:
        return
    block, index = statements.block_of(names, statement)
    if block is None or index + 1 >= len(block):
        return
    following = block[index + 1]
    if following is keep_clear or not hasattr(following, "leading_lines"):
        return
    if any(line.comment is None for line in following.leading_lines[:1]):
        return  # it is already set apart
    fix.replace(following, following.with_changes(leading_lines=[*blank, *following.leading_lines]))


def scaler_origin(ctx, unit) -> str:
    """" (the GradScaler comes from main.py)" when the unit's scaler is made in no place of this
    file but another file of the run passes one it makes to this function (the project index)."""
    index = ctx.file.project_index
    owner = unit.owner
    if index is None or not isinstance(owner, cst.FunctionDef) or any(s.creations for s in unit.scalers):
        return ""
    made_in = index.scaler_made_in(ctx.path, owner.name.value)
    return f" (the GradScaler comes from {index.relative(made_in)})" if made_in else ""
