"""Where `torch.autocast` goes: around the forward pass and the loss of one training step.

apex O1 patched torch globally, so legacy code has no region to convert. The region is found from
the loss passed to `amp.scale_loss`: the nearest statement before it that assigns the loss, and,
walking back through the statements that compute what that one reads (the loss's backward
slice), the first one that uses the model. The statements from there to the loss assignment are
wrapped. When the loss is computed in a nested block (`if accumulate:`) and the forward pass
outside it, each level gets its own region. Nothing crosses a statement that runs a backward
pass or an optimizer step, a loop boundary or the function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import (
    body_of,
    climbable,
    containing_block,
    preceding,
    walk,
)
from ampmigrate.engine.names import NameIndex

StatementTest = Callable[[cst.CSTNode], bool]


@dataclass(eq=False)
class Region:
    block: cst.CSTNode  # IndentedBlock or Module
    statements: List[cst.BaseStatement] = field(default_factory=list)


class NoRegion(Exception):
    """The structure does not allow a region; the message says why."""


def read_names(names: NameIndex, node: cst.CSTNode) -> Set[str]:
    """The names `node` reads, and the instance attributes (`self.loss_total`) it reads: a loss a
    trainer keeps on itself is followed like a local one (DG-Net's `gen_update`)."""
    found = set()
    for n in walk(node):
        if isinstance(n, cst.Name) and n in names.loads:
            found.add(n.value)
        elif isinstance(n, cst.Attribute) and _on_self(n):
            found.add(f"self.{n.attr.value}")
    return found


def _on_self(node: cst.Attribute) -> bool:
    return isinstance(node.value, cst.Name) and node.value.value == "self"


def assigned_names(node: cst.CSTNode) -> Set[str]:
    """Names a statement binds by assignment (`x = `, `x += `, `for x in`, `with ... as x`, `:=`)."""
    found: Set[str] = set()

    def targets(target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            found.add(target.value)
        elif isinstance(target, cst.Attribute) and _on_self(target):
            found.add(f"self.{target.attr.value}")
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                targets(element.value)
        elif isinstance(target, cst.StarredElement):
            targets(target.value)

    for child in walk(node):
        if isinstance(child, cst.Assign):
            for target in child.targets:
                targets(target.target)
        elif isinstance(child, (cst.AugAssign, cst.AnnAssign)):
            targets(child.target)
        elif isinstance(child, cst.For):
            targets(child.target)
        elif isinstance(child, cst.WithItem) and child.asname is not None:
            targets(child.asname.name)
        elif isinstance(child, cst.NamedExpr):
            targets(child.target)
    return found


@dataclass
class MethodEffects:
    """What the calls of methods of the enclosing class in one statement (`self.backward_G()`,
    `loss = self.backward_D_basic(...)`) do to the instance, followed into the methods of the class
    they call in turn: the attributes they assign and read, and whether any runs a backward pass or
    an optimizer step. A trainer that computes its losses in such methods (the CycleGAN template's
    `self.forward(); self.backward_G()` before `amp.scale_loss(self.loss_G, ...)`) is sliced through
    them; methods the class does not define here (a base class's) have no known effects."""

    stores: Set[str] = field(default_factory=set)
    reads: Set[str] = field(default_factory=set)
    steps: bool = False


def method_effects(names: NameIndex, statement: cst.CSTNode) -> MethodEffects:
    effects = MethodEffects()
    methods = _class_methods(names, statement)
    if methods:
        _add_effects(names, statement, methods, effects, set(), 0)
    return effects


def _class_methods(names: NameIndex, node: cst.CSTNode) -> dict:
    """{name: the method} of the class whose method (taking `self`) holds `node`; {} otherwise."""
    function = next((a for a in names.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
    if not isinstance(function, cst.FunctionDef) or not _takes_self(function):
        return {}
    block = names.parent(function)
    cls = names.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(cls, cst.ClassDef):
        return {}
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef) and _takes_self(s)}


def _takes_self(function: cst.FunctionDef) -> bool:
    params = function.params.params
    return not function.decorators and bool(params) and params[0].name.value == "self"


def _add_effects(names: NameIndex, node: cst.CSTNode, methods: dict, effects: MethodEffects, seen: Set[str], depth: int) -> None:
    for call in walk(node):
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and _on_self(call.func)):
            continue
        method = methods.get(call.func.attr.value)
        if method is None or call.func.attr.value in seen:
            continue
        seen.add(call.func.attr.value)
        if depth >= 3:
            effects.steps = True  # too deep to follow: no region crosses it
            continue
        effects.stores |= {n for n in assigned_names(method.body) if n.startswith("self.")}
        effects.reads |= {n for n in read_names(names, method.body) if n.startswith("self.")}
        if any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("backward", "step")
            for n in walk(method.body)
        ):
            effects.steps = True
        _add_effects(names, method.body, methods, effects, seen, depth + 1)


def loss_statement(names: NameIndex, with_statement: cst.CSTNode, loss: cst.BaseExpression) -> cst.BaseStatement:
    """The nearest statement before `with_statement` (same iteration) that assigns the loss,
    itself or through a method of the class it calls (`self.backward_G()` storing `self.loss_G`)."""
    wanted = read_names(names, loss)
    if not wanted:
        raise NoRegion("the loss passed to `amp.scale_loss` is computed inside the call")
    for statement in preceding(names, with_statement):
        if (assigned_names(statement) | method_effects(names, statement).stores) & wanted:
            return statement
    found = _before_reading_loops(names, with_statement, wanted)
    if found is not None:
        return found
    raise NoRegion(
        f"the loss `{cst.Module([]).code_for_node(loss).strip()}` is not computed in this function's "
        "training step (it comes from a caller or an earlier iteration), so there is no forward pass to wrap"
    )


def _before_reading_loops(names: NameIndex, with_statement: cst.CSTNode, wanted: Set[str]) -> Optional[cst.BaseStatement]:
    """The statement before the loops around `with_statement` that assigns the loss, where those
    loops only read it: one forward pass, then a step per optimizer (`loss_dict = net(x)`, the
    generator's step, then `for name, opt in d_optimizers.items(): ... amp.scale_loss(
    loss_dict["D_" + name], opt)`). Each loop's own targets (`name`) are bound by its header; a
    loop whose body assigns any other name the loss reads may carry it from an earlier iteration:
    None. The statement runs once per iteration of the loop outside, before the scaled loss."""
    wanted = set(wanted)
    node = with_statement
    while True:
        loop = next((a for a in names.ancestors(node) if isinstance(a, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef))), None)
        if not isinstance(loop, (cst.For, cst.While)) or loop.orelse is not None:
            return None
        if wanted & (assigned_names(loop.body) | method_effects(names, loop.body).stores):
            return None
        if isinstance(loop, cst.For):
            wanted -= assigned_names(cst.For(target=loop.target, iter=cst.Name("_"), body=cst.IndentedBlock([])))
        if not wanted:
            return None
        for statement in preceding(names, loop):
            if (assigned_names(statement) | method_effects(names, statement).stores) & wanted:
                return statement
        node = loop


def autocast_regions(
    names: NameIndex,
    with_statement: cst.CSTNode,
    loss: cst.BaseExpression,
    uses_model: StatementTest,
    looks_like_forward: StatementTest,
    is_barrier: StatementTest,
) -> List[Region]:
    """The regions for one `amp.scale_loss` (see the module docstring); raises NoRegion."""
    end = loss_statement(names, with_statement, loss)
    plain_barrier = is_barrier
    for statement in preceding(names, with_statement):
        if plain_barrier(statement):
            break
        if method_effects(names, statement).steps:
            # Its backward would put unscaled gradients beside the scaled ones the step unscales.
            raise NoRegion(
                f"`{cst.Module([]).code_for_node(statement).strip()}` runs a backward pass or an optimizer step "
                "in a method of the class, between the last step and this scaled loss"
            )

    def is_barrier(statement: cst.CSTNode) -> bool:  # a method of the class that runs a backward or a step, too
        return plain_barrier(statement) or method_effects(names, statement).steps

    for predicate in (uses_model, looks_like_forward):
        regions = _search(names, end, predicate, is_barrier)
        if regions is not None:
            return regions
    # No statement of the slice calls anything like a model: the loss statement itself must
    # (`loss = compute_loss(model, batch)`), or there is nothing to put under autocast.
    if any(isinstance(n, cst.Call) for n in walk(end)):
        return [Region(containing_block(names, end), [end])]
    raise NoRegion("no forward pass was found before the loss in this training step")


def _search(names: NameIndex, end: cst.BaseStatement, is_forward: StatementTest, is_barrier: StatementTest) -> Optional[List[Region]]:
    wanted = read_names(names, end) | method_effects(names, end).reads
    regions: List[Region] = []
    current = end
    include_current = True
    while True:
        block = containing_block(names, current)
        body = body_of(block) if block is not None else None
        if body is None:
            return None
        index = next(i for i, s in enumerate(body) if s is current)
        slice_statements: List[cst.BaseStatement] = []
        candidates = list(reversed(body[: index + 1] if include_current else body[:index]))
        for statement in candidates:
            if statement is not end and is_barrier(statement):
                break
            effects = method_effects(names, statement)
            if statement is end or (assigned_names(statement) | effects.stores) & wanted:
                slice_statements.append(statement)
                wanted |= read_names(names, statement) | effects.reads
        forward = [s for s in slice_statements if is_forward(s)]
        if forward:
            first = forward[-1]  # slice_statements runs backwards: the last one is the earliest
            last = slice_statements[0]
            run = list(body[_position(body, first) : _position(body, last) + 1])
            if any(is_barrier(s) for s in run if s is not end):
                return None
            regions.append(Region(block, run))
            return list(reversed(regions))
        if slice_statements:
            first, last = slice_statements[-1], slice_statements[0]
            regions.append(Region(block, list(body[_position(body, first) : _position(body, last) + 1])))
        owner = climbable(names, block)
        if owner is None:
            return None
        current = owner
        include_current = False


def _position(body, statement) -> int:
    return next(i for i, s in enumerate(body) if s is statement)


def merge(regions: List[Region]) -> Tuple[List[Region], Optional[str]]:
    """Join regions of one block that share statements; regions that nest are an error."""
    merged: List[Region] = []
    for region in regions:
        for other in merged:
            if other.block is not region.block:
                continue
            ids = {id(s) for s in other.statements}
            if any(id(s) in ids for s in region.statements):
                body = list(body_of(region.block))
                positions = [_position(body, s) for s in (*other.statements, *region.statements)]
                other.statements = body[min(positions) : max(positions) + 1]
                break
        else:
            merged.append(Region(region.block, list(region.statements)))
    # A region inside another region's statements cannot be wrapped twice.
    for region in merged:
        for other in merged:
            if other is region:
                continue
            if any(region.block is node for statement in other.statements for node in walk(statement)):
                return merged, "the forward pass and the loss are nested in a way one autocast region cannot cover"
    return merged, None
