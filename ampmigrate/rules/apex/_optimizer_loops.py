"""Several optimizers stepped in a loop over the collection given to `amp.scale_loss`.

    optimizers = [self.optimizers[k] for k in names]
    with amp.scale_loss(loss, optimizers) as scaled_loss:
        scaled_loss.backward()
    for name in names:
        clip_grad_norm_(amp.master_params(self.optimizers[name]), 5.0)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()

apex with a list of optimizers and one loss used one loss scaler for all of them (`num_losses=1`).
torch's recipe for one loss and several optimizers ("Working with Multiple Models, Losses, and
Optimizers"): one GradScaler, `scaler.unscale_(opt)` at most once per optimizer before its clip,
`scaler.step(opt)` for each, then one `scaler.update()` after all the steps. So the loop's
`o.step()` becomes `scaler.step(o)` and `scaler.update()` goes after the loop, never inside it.

The loop must iterate the very collection `amp.scale_loss` was given: the same name, bound once
in the function, or the same attribute chain, not assigned in the function; its body steps the
loop variable once, as a statement of its own, and cannot leave early (`break`, `continue`,
`return`, ...), so every optimizer steps once.

A clip of `amp.master_params(<opt>)` in a loop whose every iteration names one optimizer of the
group once (`for name in names: clip(amp.master_params(self.optimizers[name]))` with `names` the
keys of that dict, or `for o in optimizers: clip(amp.master_params(o))`) is unscaled per
iteration, right before the clip: each optimizer is unscaled once per step.

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import containing_block, expression_key, following, loops_between, walk
from ampmigrate.rules.apex._amp_common import Step, Unfixable

_EARLY_EXITS = (cst.Break, cst.Continue, cst.Return, cst.Raise, cst.Yield, cst.Await)


class OptimizerLoops:
    def _init_optimizer_loops(self) -> None:
        if not hasattr(self, "_loop_steps"):
            self._loop_steps: Dict[cst.Call, cst.For] = {}  # `o.step()` -> its loop over the optimizers
            self._collections: Dict[str, str] = {}  # the collection's code -> the stepping loop's variable
            self._reading_loops: Dict[cst.CSTNode, cst.For] = {}  # an `unscale_` point -> its loop

    # ---- the steps
    def _steps_in_optimizer_loop(self, step: Step, optimizer: cst.BaseExpression) -> List[cst.Call]:
        """`for o in X: o.step()` after `amp.scale_loss(loss, X)`; [] where there is none."""
        self._init_optimizer_loops()
        wanted = expression_key(optimizer)
        built = self._built_from(optimizer, step)
        values_of = built[0] if built is not None else None
        for statement in following(self.names, step.with_node, out_of_loops=True):
            loops = [
                n for n in walk(statement)
                if isinstance(n, cst.For) and (
                    expression_key(n.iter) == wanted or (values_of is not None and _values_of(n.iter, values_of))
                )
            ]
            for loop in loops:
                calls = self._loop_step_calls(loop)
                if calls:
                    if expression_key(loop.iter) != wanted and not self._same_collection_anchor(values_of, step):
                        raise Unfixable(
                            f"the loop at line {self._line(loop)} steps the optimizers of "
                            f"`{self.ctx.code(values_of).strip()}`, which the function assigns: they may not be the "
                            f"ones given to `amp.scale_loss` at line {self._line(step.call)}"
                        )
                    if not self._same_collection_anchor(optimizer, step):
                        raise Unfixable(
                            f"the loop at line {self._line(loop)} steps the optimizers of "
                            f"`{self.ctx.code(optimizer).strip()}`, which may not be the ones given to "
                            f"`amp.scale_loss` at line {self._line(step.call)} (it is bound more than once, or outside the function)"
                        )
                    for call in calls:
                        self._loop_steps[call] = loop
                    self._collections[self.ctx.code(optimizer).strip()] = loop.target.value
                    return calls
        return []

    def _built_from(self, optimizer: cst.BaseExpression, step: Step) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
        """(`D`, `keys`) where `optimizer` is a name bound once to `[D[k] for k in keys]` and `keys`
        (or the value of a name bound once) is the keys of `D`: every optimizer of the dict once."""
        built = _single_value(self.names, optimizer, step)
        if not (
            isinstance(built, cst.ListComp) and built.for_in.inner_for_in is None and not built.for_in.ifs
            and isinstance(built.for_in.target, cst.Name) and isinstance(built.elt, cst.Subscript)
            and len(built.elt.slice) == 1 and isinstance(built.elt.slice[0].slice, cst.Index)
            and isinstance(built.elt.slice[0].slice.value, cst.Name)
            and built.elt.slice[0].slice.value.value == built.for_in.target.value
        ):
            return None
        mapping, keys = built.elt.value, built.for_in.iter
        value = _single_value(self.names, keys, step) if isinstance(keys, cst.Name) else keys
        return (mapping, keys) if value is not None and _keys_of(value, mapping) else None

    def _same_collection_anchor(self, optimizer: cst.BaseExpression, step: Step) -> bool:
        """`optimizer` names one collection wherever the function reads it: a name bound once in
        the function (by `=` or as a parameter), or an attribute chain the function never assigns."""
        function = step.function.node
        if isinstance(optimizer, cst.Name):
            bindings = self.names.bindings_of(optimizer)
            return len(bindings) == 1 and bindings[0].kind in ("assign", "param") and bindings[0].scope is step.function
        if isinstance(optimizer, cst.Attribute):
            root = optimizer
            while isinstance(root, cst.Attribute):
                root = root.value
            if not isinstance(root, cst.Name):
                return False
            wanted = expression_key(optimizer)
            for node in walk(function):
                targets = []
                if isinstance(node, cst.Assign):
                    targets = [t.target for t in node.targets]
                elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                    targets = [node.target]
                elif isinstance(node, cst.For):
                    targets = [node.target]
                if any(expression_key(t) == wanted for t in targets):
                    return False
            return True
        return False

    def _loop_step_calls(self, loop: cst.For) -> List[cst.Call]:
        """The one `o.step()` of `for o in ...:`, a statement directly in its body; [] otherwise
        (the loop does something else), Unfixable where it steps in a way the fix cannot keep."""
        if not isinstance(loop.target, cst.Name):
            return []
        variable = loop.target.value
        calls = [
            c for c in self._step_calls(loop.body)
            if isinstance(c.func.value, cst.Name) and c.func.value.value == variable
        ]
        if not calls:
            return []
        where = f"the loop over the optimizers at line {self._line(loop)}"
        if len(calls) > 1:
            raise Unfixable(f"{where} steps `{variable}` more than once")
        if loop.orelse is not None or loop.asynchronous is not None:
            raise Unfixable(f"{where} has an `else` or is `async`")
        for node in walk(loop.body):
            if isinstance(node, _EARLY_EXITS):
                raise Unfixable(f"{where} can leave an iteration early, so not every optimizer may step")
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.With, cst.NamedExpr)):
                if any(isinstance(t, cst.Name) and t.value == variable for t in _targets(node)):
                    raise Unfixable(f"{where} binds `{variable}` again")
        line = self._step_line(calls[0])
        if containing_block(self.names, line) is not loop.body:
            raise Unfixable(f"`{variable}.step()` at line {self._line(line)} is not a statement of {where} itself")
        return calls

    def _step_anchor(self, call: cst.Call) -> cst.CSTNode:
        """The statement of the step's block that `scaler.update()` follows: the loop for a step
        inside a loop over the optimizers, else the step's own line."""
        self._init_optimizer_loops()
        loop = self._loop_steps.get(call)
        return loop if loop is not None else self._step_line(call)

    def _emit_loop_update(self, call: cst.Call, step: Step) -> None:
        """`scaler.update()` once, after the loop that steps every optimizer."""
        loop = self._loop_steps[call]
        self.builder.insert_after(loop, self._scaler_call(step, loop, "update()"))

    def _in_optimizer_loop(self, call: cst.Call) -> Optional[cst.For]:
        self._init_optimizer_loops()
        return self._loop_steps.get(call)

    # ---- unscale_
    def _unscale_code(self, scaler: str, optimizer: str) -> str:
        """`scaler.unscale_(opt)`, or for a collection stepped in a loop, the same loop unscaling
        each of its optimizers."""
        self._init_optimizer_loops()
        variable = self._collections.get(optimizer)
        if variable is None:
            return f"{scaler}.unscale_({optimizer})"
        return f"for {variable} in {optimizer}:\n    {scaler}.unscale_({variable})"

    def _per_optimizer_point(self, reader: cst.CSTNode, optimizers: List[str], step: Step, master_refs) -> Optional[cst.CSTNode]:
        """Where `unscale_` goes for `amp.master_params(<opt>)` in a loop whose every iteration
        names one optimizer of the step's group, once: right before the reader's statement in the
        loop's body. None where the reader is not in such a loop."""
        self._init_optimizer_loops()
        if reader not in master_refs or len(optimizers) != 1:
            return None
        argument = reader.args[0].value
        function = step.function.node
        loops = loops_between(self.names, reader, function)
        if not loops:
            return None
        loop = loops[-1]  # the innermost: the read runs once per iteration of it
        if not (isinstance(loop, cst.For) and isinstance(loop.target, cst.Name)) or not self._one_per_iteration(loop, argument, step):
            # `unscale_` would go before the loop, where the loop's variables are not bound yet.
            bound = {t.value for l in loops if isinstance(l, cst.For) for t in _targets(l) if isinstance(t, cst.Name)}
            if any(isinstance(n, cst.Name) and n.value in bound for n in walk(argument)):
                raise Unfixable(
                    f"`amp.master_params` at line {self._line(reader)} reads the optimizer the loop at line "
                    f"{self._line(loop)} names, and the fix cannot tell that each iteration names another "
                    "optimizer of the group (GradScaler unscales each once per step)"
                )
            return None
        statement = self.names.statement_of(reader)
        if containing_block(self.names, statement) is None:
            statement = self.names.statement_of(self.names.parent(statement))
        self._reading_loops[statement] = loop
        return statement

    def _one_per_iteration(self, loop: cst.For, argument: cst.BaseExpression, step: Step) -> bool:
        """`for o in optimizers: ... master_params(o)` over the stepped collection, or `for k in
        names: ... master_params(D[k])` where the collection is `[D[k] for k in names]` (one name,
        bound once) and `names` the keys of `D` (distinct, so each optimizer once)."""
        variable = loop.target.value
        for optimizer in step.optimizers:
            code = self.ctx.code(optimizer).strip()
            if code not in self._collections:
                continue
            if isinstance(argument, cst.Name) and argument.value == variable:
                if expression_key(loop.iter) == expression_key(optimizer):
                    return True
                continue
            if not (isinstance(argument, cst.Subscript) and len(argument.slice) == 1):
                continue
            index = argument.slice[0].slice
            if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Name) and index.value.value == variable):
                continue
            built = self._built_from(optimizer, step)
            if (
                built is not None and expression_key(built[0]) == expression_key(argument.value)
                and expression_key(built[1]) == expression_key(loop.iter) and self._same_collection_anchor(built[0], step)
            ):
                return True
        return False

    def _loop_of_point(self, point: cst.CSTNode) -> Optional[cst.For]:
        self._init_optimizer_loops()
        return self._reading_loops.get(point)

    def _check_loop_unscales(self, inserts) -> None:
        """A per-optimizer `unscale_` in a loop and another `unscale_` for the same step could
        unscale one optimizer twice (GradScaler raises): refused."""
        self._init_optimizer_loops()
        for point in self._reading_loops:
            steps = {step for _, step in inserts.get(point, ())}
            for other, pairs in inserts.items():
                if other is not point and any(step in steps for _, step in pairs):
                    raise Unfixable(
                        f"the optimizers' gradients are unscaled one by one in the loop at line "
                        f"{self._line(self._reading_loops[point])} and read again at line {self._line(other)}; "
                        "GradScaler unscales each optimizer once per step"
                    )


def _single_value(names, expression: cst.BaseExpression, step: Step) -> Optional[cst.BaseExpression]:
    """The value of a name bound once, by `=`, in the step's function."""
    if not isinstance(expression, cst.Name):
        return None
    bindings = names.bindings_of(expression)
    if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].scope is not step.function:
        return None
    return bindings[0].value


def _values_of(value: cst.BaseExpression, mapping: cst.BaseExpression) -> bool:
    """`value` is `mapping.values()` (or a `list(...)`/`tuple(...)` of it)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("list", "tuple"):
        if len(value.args) != 1 or value.args[0].keyword is not None or value.args[0].star:
            return False
        value = value.args[0].value
    return (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "values"
        and not value.args and expression_key(value.func.value) == expression_key(mapping)
    )


def _keys_of(value: cst.BaseExpression, mapping: cst.BaseExpression) -> bool:
    """`value` is the keys of `mapping`, each once: `D`, `D.keys()`, `list(...)`/`sorted(...)` of those."""
    wanted = expression_key(mapping)
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("list", "sorted", "tuple"):
        if len(value.args) != 1 or value.args[0].keyword is not None or value.args[0].star:
            return False
        value = value.args[0].value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "keys" and not value.args:
        value = value.func.value
    return expression_key(value) == wanted


def _targets(node: cst.CSTNode) -> List[cst.CSTNode]:
    if isinstance(node, cst.Assign):
        found = [t.target for t in node.targets]
    elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
        found = [node.target]
    elif isinstance(node, cst.NamedExpr):
        found = [node.target]
    elif isinstance(node, cst.With):
        found = [i.asname.name for i in node.items if i.asname is not None]
    else:
        found = []
    out: List[cst.CSTNode] = []
    while found:
        target = found.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            found.extend(e.value for e in target.elements)
        else:
            out.append(target)
    return out
