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

from typing import Dict, List, Optional

import libcst as cst

from ampmigrate.analysis.statements import containing_block, expression_key, following, walk
from ampmigrate.rules.apex._amp_common import Step, Unfixable

_EARLY_EXITS = (cst.Break, cst.Continue, cst.Return, cst.Raise, cst.Yield, cst.Await)


class OptimizerLoops:
    def _init_optimizer_loops(self) -> None:
        if not hasattr(self, "_loop_steps"):
            self._loop_steps: Dict[cst.Call, cst.For] = {}  # `o.step()` -> its loop over the optimizers

    # ---- the steps
    def _steps_in_optimizer_loop(self, step: Step, optimizer: cst.BaseExpression) -> List[cst.Call]:
        """`for o in X: o.step()` after `amp.scale_loss(loss, X)`; [] where there is none."""
        self._init_optimizer_loops()
        wanted = expression_key(optimizer)
        for statement in following(self.names, step.with_node, out_of_loops=True):
            loops = [
                n for n in walk(statement)
                if isinstance(n, cst.For) and expression_key(n.iter) == wanted
            ]
            for loop in loops:
                calls = self._loop_step_calls(loop)
                if calls:
                    if not self._same_collection_anchor(optimizer, step):
                        raise Unfixable(
                            f"the loop at line {self._line(loop)} steps the optimizers of "
                            f"`{self.ctx.code(optimizer).strip()}`, which may not be the ones given to "
                            f"`amp.scale_loss` at line {self._line(step.call)} (it is assigned more than once)"
                        )
                    for call in calls:
                        self._loop_steps[call] = loop
                    return calls
        return []

    def _same_collection_anchor(self, optimizer: cst.BaseExpression, step: Step) -> bool:
        """`optimizer` names one collection wherever the function reads it: a name bound once in
        the function, or an attribute chain the function never assigns."""
        function = step.function.node
        if isinstance(optimizer, cst.Name):
            bindings = self.names.bindings_of(optimizer)
            return len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].scope is step.function
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
