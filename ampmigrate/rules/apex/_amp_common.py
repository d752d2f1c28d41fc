"""Types shared by the apex.amp migration's modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set

import libcst as cst

from ampmigrate.analysis.statements import Branch, is_pure
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.names import Scope

CODE = "AMP101"
O3_CODE = "AMP102"
O0_CODE = "AMP103"
HANDLE_CODE = "AMP104"


class Unfixable(Exception):
    """Raised while planning; the message says why, for the user."""


@dataclass(eq=False)
class Site:
    """A use of apex.amp reported as a finding (the callee of the call), and its rule."""

    node: cst.CSTNode
    code: str
    api: str


@dataclass
class AmpPlan:
    sites: List[Site] = field(default_factory=list)
    fix: Optional[Fix] = None
    reason: Optional[str] = None
    levels: Set[str] = field(default_factory=set)


@dataclass(eq=False)
class Step:
    """One `with amp.scale_loss(...)` and what belongs to it."""

    with_node: cst.With
    call: cst.Call
    loss: cst.BaseExpression
    optimizers: List[cst.BaseExpression]
    backward_args: Sequence[cst.Arg]
    function: Scope
    branches: List[Branch]  # the `if` branches around it in its function (apex tests folded)
    steps: List[cst.Call] = field(default_factory=list)  # the `optimizer.step()` calls after it
    # What the `with` body does after `scaled_loss.backward()` (an all-reduce of the still-scaled
    # gradients, logging): it follows `scaler.scale(loss).backward()` unchanged.
    rest: Sequence[cst.BaseStatement] = ()
    # `scaled_loss.backward(...)` calls inside the body's own blocks (`if sync: ... else: with
    # model.no_sync(): scaled_loss.backward()`), when it does not start with one: each becomes
    # `scaler.scale(loss).backward(...)` where it is, and the body replaces the `with`.
    backward_calls: Sequence[cst.Call] = ()
    # The body uses the scaled loss for more than its backward (`torch.autograd.grad(scaled_loss,
    # x)`, logging it, reading it after the block): `<name> = scaler.scale(loss)` binds it, as the
    # `with` did, and the whole body follows unchanged.
    binds_scaled: Optional[str] = None


def plain_optimizer(node: cst.BaseExpression) -> bool:
    """A name, an attribute chain, or one of those indexed by a literal (`optimizers["softmax"]`,
    a dict of optimizers by role): an expression naming the same object each time it is read."""
    if isinstance(node, cst.Subscript):
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return False
        key = node.slice[0].slice.value
        return isinstance(key, (cst.SimpleString, cst.Integer)) and plain_optimizer(node.value)
    return isinstance(node, (cst.Name, cst.Attribute)) and is_pure(node)
