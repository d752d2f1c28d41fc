"""Tests of whether apex imported (`amp is None`, `assert amp`, `if args.fp16 and amp is not None`).

Once apex.amp is migrated the module is gone and torch.amp is always there, so such a test has a
known value: `amp is not None` is True, `amp is None` False. `simplify` folds that value through
`not`, `and` and `or` (dropping only operands without side effects), and `presence_action` says
what to do with the statement around it: drop an `assert`, drop an `if` that can no longer run,
unwrap one that always runs, or write the simplified test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Set, Union

import libcst as cst

from ampmigrate.analysis.statements import is_pure, walk
from ampmigrate.engine.names import NameIndex

Folded = Union[bool, cst.BaseExpression]


class Unsupported(Exception):
    pass


# What a test of apex's presence becomes for one reference: None when apex's presence is now
# simply True, else the expression that is true exactly where apex was bound (`scaler.is_enabled()`
# where `amp = None` stood for "fp16 off", not for "apex missing").
Present = Optional[Callable[[cst.CSTNode], cst.BaseExpression]]


def _atom_value(node: cst.CSTNode, refs: Set[cst.CSTNode], present: Present = None) -> Optional[Folded]:
    """The value of `amp is None` / `amp is not None` / a bare `amp` once apex is replaced."""
    if isinstance(node, cst.Comparison) and node.left in refs and len(node.comparisons) == 1:
        target = node.comparisons[0]
        if isinstance(target.comparator, cst.Name) and target.comparator.value == "None":
            if isinstance(target.operator, cst.IsNot):
                return True if present is None else present(node.left)
            if isinstance(target.operator, cst.Is):
                return False if present is None else cst.UnaryOperation(cst.Not(), present(node.left))
        raise Unsupported("compared to something other than None")
    if node in refs:
        return True if present is None else present(node)
    return None


def simplify(expression: cst.BaseExpression, refs: Set[cst.CSTNode], present: Present = None) -> Folded:
    value = _atom_value(expression, refs, present)
    if value is not None:
        return value
    if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not):
        inner = simplify(expression.expression, refs, present)
        if isinstance(inner, bool):
            return not inner
        return expression.with_changes(expression=inner)
    if isinstance(expression, cst.BooleanOperation):
        left, right = simplify(expression.left, refs, present), simplify(expression.right, refs, present)
        is_and = isinstance(expression.operator, cst.And)
        absorbing = not is_and  # False absorbs `and`, True absorbs `or`
        if isinstance(left, bool):
            return absorbing if left == absorbing else right
        if isinstance(right, bool):
            if right != absorbing:
                return left
            if is_pure(left):
                return absorbing
            raise Unsupported("an operand with side effects")
        if left is expression.left and right is expression.right:
            return expression
        return expression.with_changes(left=left, right=right)
    if any(n in refs for n in walk(expression)):
        raise Unsupported("used inside an expression")
    return expression


@dataclass
class Action:
    kind: str  # "remove" | "unwrap" | "choose" (an arm of `a if test else b`) | "replace"
    node: cst.CSTNode
    new: Optional[cst.CSTNode] = None


def presence_action(names: NameIndex, ref: cst.CSTNode, refs: Set[cst.CSTNode], present: Present = None) -> Action:
    """What to do about one presence test; raises Unsupported when it is used otherwise."""
    top: cst.CSTNode = ref
    parent = names.parent(top)
    while (
        isinstance(parent, cst.BooleanOperation)
        or (isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not))
        or (isinstance(parent, cst.Comparison) and parent.left is top)
    ):
        top = parent
        parent = names.parent(top)
    in_test = isinstance(parent, (cst.If, cst.While, cst.IfExp, cst.Assert)) and parent.test is top
    bare = not (isinstance(names.parent(ref), cst.Comparison) and names.parent(ref).left is ref)
    if bare and not in_test:
        if _none_arm(ref, parent, refs):
            return Action("replace", ref, cst.Name("None"))
        # `f(amp)`, `x = amp or y`: the module itself is the value, not a test of it.
        raise Unsupported("used as a value")
    value = simplify(top, refs, present)
    if isinstance(parent, cst.Assert) and parent.test is top:
        if value is True:
            return Action("remove", names.parent(parent) if _alone(names, parent) else parent)
        raise Unsupported("an assert that would now always fail")
    if isinstance(parent, cst.If) and parent.test is top:
        if value is False and parent.orelse is None:
            return Action("remove", parent)
        if value is True:
            return Action("unwrap", parent, parent.body)
        if value is False and isinstance(parent.orelse, cst.Else):
            return Action("unwrap", parent, parent.orelse.body)
        if isinstance(value, bool):
            raise Unsupported("an `elif` chain whose first test is now constant")
    if isinstance(parent, cst.IfExp) and parent.test is top and isinstance(value, bool):
        # `amp.state_dict() if amp else None`: the arm that is now always taken.
        return Action("choose", parent, parent.body if value else parent.orelse)
    if isinstance(value, bool):
        return Action("replace", top, cst.Name("True" if value else "False"))
    return Action("replace", top, value)


def _none_arm(ref: cst.CSTNode, parent: cst.CSTNode, refs: Set[cst.CSTNode]) -> bool:
    """`amp` as the arm of `x if amp is not None else amp` that runs only where it is None
    (BERT-Relation-Extraction's `'amp': amp.state_dict() if amp is not None else amp`): the
    value there is None. The test must hold wherever apex is bound, so that its other arm is
    taken exactly where `amp` is None (`args.fp16 and amp is not None` does not say that)."""
    if not isinstance(parent, cst.IfExp) or ref is parent.test:
        return False
    if not any(n in refs for n in walk(parent.test)):
        return False
    try:
        value = simplify(parent.test, refs)
    except Unsupported:
        return False
    return (value is True and ref is parent.orelse) or (value is False and ref is parent.body)


def _alone(names: NameIndex, small: cst.CSTNode) -> bool:
    line = names.parent(small)
    return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1


def choose(if_exp: cst.IfExp, arm: cst.CSTNode) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """A replacement function: one arm of the conditional expression, after the changes inside
    it, keeping the expression's own parentheses."""
    use_body = arm is if_exp.body

    def replacement(updated: cst.CSTNode) -> cst.CSTNode:
        chosen = updated.body if use_body else updated.orelse
        if updated.lpar and not chosen.lpar:
            chosen = chosen.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        return chosen

    return replacement


def unwrap(if_node: cst.If, arm: cst.CSTNode) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """A replacement function: the statements of one arm of the `if` (its body or its `else`),
    in its place, after the changes inside them."""
    use_body = arm is if_node.body

    def replacement(updated: cst.CSTNode) -> cst.CSTNode:
        body = updated.body if use_body else updated.orelse.body
        if not isinstance(body, cst.IndentedBlock):
            return updated
        statements = list(body.body)
        if not statements:
            return cst.RemovalSentinel.REMOVE
        statements[0] = statements[0].with_changes(
            leading_lines=[*updated.leading_lines, *statements[0].leading_lines]
        )
        return cst.FlattenSentinel(statements)

    return replacement
