"""The optimizer step after the loop of a per-step helper (gradient accumulation inside it).

    def _train_batch(self, batches):
        self.optimizer.zero_grad()
        for i in range(self.accumulation_steps):
            loss = self.model(next(batches)).mean() / self.accumulation_steps
            with amp.scale_loss(loss, self.optimizer, delay_unscale=...) as scaled_loss:
                scaled_loss.backward()
        self.optimizer.step()

The planner looks for the step after `amp.scale_loss` up to the function's outermost loop. Here
that loop accumulates for one step (over micro-batches, or over losses: DeepPrivacy's `_backward`
runs each loss function of a list), the step follows it directly in the function's body, and every
use of the function is a call from a loop or another function: each call accumulates and steps
once. GradScaler's documented accumulation is exactly this: `scaler.scale(loss).backward()`
on every micro-batch, `scaler.step(opt)` + `scaler.update()` once after them; apex skipped the
step when any micro-batch overflowed, and the inf check of the accumulated gradients does the same.

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from ampmigrate.analysis.statements import expression_key, walk
from ampmigrate.rules.apex._amp_common import Step


class LoopHelperSteps:
    def _steps_after_helper_loop(self, step: Step, optimizer: cst.BaseExpression) -> List[cst.Call]:
        function = step.function.node
        if not isinstance(function, cst.FunctionDef) or not isinstance(function.body, cst.IndentedBlock):
            return []
        loop: Optional[cst.CSTNode] = None
        for ancestor in self.names.ancestors(step.with_node):
            if ancestor is function:
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                loop = ancestor
        body = list(function.body.body)
        if loop is None or not any(statement is loop for statement in body) or getattr(loop, "orelse", None) is not None:
            return []
        wanted = expression_key(optimizer)
        for statement in body[body.index(loop) + 1 :]:
            calls = [c for c in self._step_calls(statement) if expression_key(c.func.value) == wanted]
            if calls:
                if not isinstance(statement, cst.SimpleStatementLine) or not self._only_called(step.function):
                    return []
                self._note(
                    f"`{function.name.value}()` accumulates over its loop and steps after it, once per call: "
                    "`scaler.step` + `scaler.update()` there, as GradScaler's accumulation does"
                )
                return calls
        return []

    def _only_called(self, scope) -> bool:
        """Every use of the function's name in the file is a call (a method's through `self`) from
        a loop or another function, and there is at least one: a helper of a training step, not a
        script's one run of its training (`train(model, loader)` at module level, whose loop is
        the epoch: a step after it would be one step after training)."""
        function = scope.node
        name = function.name.value
        method = scope.parent is not None and scope.parent.kind == "class"
        calls = 0
        for node in walk(self.module, into_scopes=True):
            if method and isinstance(node, cst.Attribute) and node.attr.value == name:
                if not (isinstance(node.value, cst.Name) and node.value.value == "self"):
                    return False
                use = node
            elif not method and isinstance(node, cst.Name) and node.value == name and node is not function.name:
                if not any(b.node is function for b in self.names.bindings_of(node)):
                    continue
                use = node
            else:
                continue
            call = self.names.parent(use)
            if not (isinstance(call, cst.Call) and call.func is use and self._in_loop_or_function(call)):
                return False
            calls += 1
        return calls > 0

    def _in_loop_or_function(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, (cst.For, cst.While, cst.FunctionDef, cst.Lambda)) for a in self.names.ancestors(node))
