"""apex's amp module carried by an object through the file (issue 12: amp stored as a value).

UER-py and its descendants set apex up in `worker()` and hand it on as an attribute of the
argument namespace, which the training code of the same file reads:

    if args.fp16:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
        args.amp = amp
    ...
    def train(self, args, ...):          # a method, reached through a dict of trainer classes
        if args.fp16:
            with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

No call graph reaches the method, but the object that carries the module reaches it: the
migration keeps that route. The store becomes `args.amp_scaler = scaler` (the GradScaler made
where `amp.initialize` was, set exactly where apex's module was) and every `<x>.amp.<api>` becomes
`<x>.amp_scaler.<...>`. The training code only touched `<x>.amp` where apex had been set up (else
AttributeError), so each new access (`scaler.step`, `unscale_`, autocast's `enabled`) is put under
the test that chose the scaled backward there (`if args.fp16:` again, with `optimizer.step()` in its
`else`): where that test is false the attribute may not exist, as `args.amp` did not.

When (else the usual planning, which refuses the value use):
- the file stores apex's amp module in `<x>.<attr>` only in the block of `amp.initialize`, after it;
- every other use of `.<attr>` in the file is a call of an apex API on it, in a function that reads
  it through one pure expression (`args`, `self.args`);
- the project index shows every store to `.<attr>` in the run is that module or None, and every other
  file storing or reading `.<attr>` does both itself and neither imports the other (each is its own
  program: its own migration carries its own scaler).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

import libcst as cst

from ampmigrate.analysis.statements import condition_code, expression_key, is_pure
from ampmigrate.api import APEX_AMP_API, APEX_AMP_MODULE
from ampmigrate.rules.apex._amp_common import Unfixable

if TYPE_CHECKING:
    from ampmigrate.engine.context import FileContext
    from ampmigrate.rules.apex._amp_refs import AmpRef

CARRIED_NAME = "amp_scaler"  # contains "amp": the index records every store to it (engine/apex_attrs.py)


@dataclass
class Carrier:
    attr: str  # the attribute apex's module is stored in (`amp`)
    stores: List[cst.Assign] = field(default_factory=list)  # `args.amp = amp`
    blocker: Optional[str] = None  # why the route cannot be kept (raised when the plan needs it)


def find_carrier(ctx: "FileContext", refs: List["AmpRef"]) -> Optional[Carrier]:
    """The attribute carrying apex's module in this file, with the loads turned into refs (added to
    `refs`, each with its `carrier` expression) and the stores marked "carry"; None when the file
    stores the module in no attribute."""
    names = ctx.names
    stores: Dict[str, List] = {}
    for ref in refs:
        if ref.api is not None:
            continue
        assign = names.parent(ref.node)
        if (
            isinstance(assign, cst.Assign)
            and assign.value is ref.node
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Attribute)
        ):
            stores.setdefault(assign.targets[0].target.attr.value, []).append((ref, assign))
    if len(stores) != 1:
        return None
    attr, found = next(iter(stores.items()))
    carrier = Carrier(attr, [assign for _, assign in found])
    carrier.blocker = _project_blocker(ctx, attr)
    loads: List["AmpRef"] = []
    from ampmigrate.rules.apex._amp_refs import AmpRef

    targets = {id(assign.targets[0].target) for assign in carrier.stores}
    resolved = {id(ref.node) for ref in refs}  # `self.amp.scale_loss` the name pass already follows
    for node in names.nodes_of_type(cst.Attribute):
        if node.attr.value != attr or id(node) in targets:
            continue
        parent = names.parent(node)
        api = None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            api = APEX_AMP_API.get(f"{APEX_AMP_MODULE}.{parent.attr.value}")
        if id(parent) in resolved:
            return None  # the module reached through names (a class's `self.amp`): the usual planning's
        call = names.parent(parent) if api is not None else None
        if api is None or node in names.store_attributes or not (isinstance(call, cst.Call) and call.func is parent):
            carrier.blocker = carrier.blocker or (
                f"`{ctx.code(node).strip()}` at line {ctx.position(node).start.line} uses the attribute holding "
                "apex's amp module other than by calling an apex function on it"
            )
            continue
        loads.append(AmpRef(parent, api, call, carrier=node.value))
    if not loads:
        return None  # stored for another file to read: the index's business (rules/apex/amp_attribute.py)
    for ref, _ in found:
        ref.api = "carry"
    refs.extend(loads)
    return carrier


def _project_blocker(ctx: "FileContext", attr: str) -> Optional[str]:
    """Why the run's other files forbid the route (see the module docstring), or None."""
    index = ctx.project_index
    if index is None:
        return None  # a file on its own: nothing else can read the attribute
    here = os.path.abspath(ctx.path)
    if index.apex_attr(attr) is None:
        return f"some store to `.{attr}` in the project is not apex's amp module, so the attribute cannot change name"
    carriers = index.apex_attr_files(attr)
    if here not in carriers:
        return None  # the index did not read this file (changed since): judged on the file alone
    for other, (stores, loads) in carriers.items():
        if other == here:
            continue
        if not (stores and loads):
            return (
                f"{index.relative(other)} {'stores' if stores else 'reads'} `.{attr}` without "
                f"{'reading' if stores else 'storing'} it: the attribute's route crosses files"
            )
        if index.imports_file(here, other) or index.imports_file(other, here):
            return f"{index.relative(other)} also carries apex's amp in `.{attr}` and one file imports the other"
    return None


def carried_expression(ref: "AmpRef", ctx: "FileContext") -> str:
    """`args` of `args.amp.scale_loss(...)`, checked to be pure (it is spelled again)."""
    if not is_pure(ref.carrier):
        raise Unfixable(
            f"`{ctx.code(ref.carrier).strip()}` at line {ctx.position(ref.carrier).start.line} carries apex's amp "
            "module but is not a plain name or attribute, so the scaler cannot be reached through it again"
        )
    return ctx.code(ref.carrier).strip()


def carrier_scopes(planner) -> Dict[object, str]:
    """{function scope: the carrier expression there} for the functions that read apex's module
    through the carrier; each such function reads it through one expression, and nothing else of
    apex."""
    scopes: Dict[object, str] = {}
    keys: Dict[object, object] = {}
    carried = [r for r in planner.refs if r.carrier is not None]
    for ref in carried:
        scope = planner._function_scope(ref.node)
        code = carried_expression(ref, planner.ctx)
        key = expression_key(ref.carrier)
        if scope in keys and keys[scope] != key:
            raise Unfixable(
                f"`{scope.node.name.value}()` reads apex's amp module through two objects, so which one carries "
                "the scaler cannot be told"
            )
        scopes[scope], keys[scope] = code, key
    for ref in planner.refs:
        if ref.carrier is None and ref.api not in (None, "carry", "initialize", "init") and planner._function_scope(ref.node) in scopes:
            raise Unfixable(
                f"line {planner._line(ref.node)} uses apex's amp module directly in a function that reads it "
                "through the object carrying it"
            )
    return scopes


def carried_autocast_enabled(planner, at: cst.CSTNode) -> Optional[str]:
    """autocast's `enabled` in a function reaching the scaler through the carrier: the test that
    chose the scaled backward there (where it is false, apex was not set up), and the scaler's own
    `is_enabled()` when its creation has conditions (an O0 run); None when always on."""
    scope = planner._function_scope(at)
    here = {b.key for b in planner._branches(at, scope.node)}
    guards = set()
    for step in planner.fp16_steps:
        if step.function is scope:
            missing = [b for b in step.branches if planner._chooses_backward(b) and b.key not in here]
            guards.add(condition_code(planner.module, missing) if missing else "")
    if None in guards or len(guards) > 1:
        raise Unfixable(
            f"the scaled backward passes of `{scope.node.name.value}()` run under different tests, so autocast "
            "cannot be enabled exactly where apex was"
        )
    parts = [g for g in guards if g]
    if planner.access.conditions:
        parts = [f"({p})" if _looser_than_and(p) else p for p in parts]
        parts.append(f"{planner.access.carried(at)}.{CARRIED_NAME}.is_enabled()")
    return " and ".join(parts) or None


def _looser_than_and(code: str) -> bool:
    expression = cst.parse_expression(code)
    return not expression.lpar and (
        isinstance(expression, (cst.IfExp, cst.Lambda, cst.NamedExpr))
        or isinstance(expression, cst.BooleanOperation) and isinstance(expression.operator, cst.Or)
    )


def check_stores(planner) -> None:
    """Each store is a statement of its own after `amp.initialize`, in the same block."""
    carrier: Carrier = planner.usage.carrier
    if carrier.blocker:
        raise Unfixable(carrier.blocker)
    init_line = planner.init_line
    block = planner.names.parent(init_line)
    for assign in carrier.stores:
        line = planner.names.parent(assign)
        body = getattr(block, "body", ())
        if not (
            isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and line in body
            and list(body).index(line) > list(body).index(init_line)
        ):
            raise Unfixable(
                f"apex's amp module is stored in `.{carrier.attr}` at line {planner._line(assign)}, away from "
                "`amp.initialize`: the scaler would not be set where the module was"
            )


def emit_stores(planner) -> None:
    """`args.amp = amp` -> `args.amp_scaler = scaler`."""
    carrier: Carrier = planner.usage.carrier
    scaler = planner.access.home_expression()
    for assign in carrier.stores:
        target = assign.targets[0].target
        new_target = target.with_changes(attr=cst.Name(CARRIED_NAME))
        planner.builder.replace(
            assign,
            assign.with_changes(targets=[assign.targets[0].with_changes(target=new_target)], value=cst.Name(scaler)),
        )
        planner.handled.add(assign)
    planner._note(
        f"the scaler travels where apex's module did: `.{carrier.attr}` becomes `.{CARRIED_NAME}`, used under the "
        "tests that chose apex"
    )
