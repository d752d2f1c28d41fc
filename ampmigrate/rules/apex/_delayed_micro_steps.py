"""The accumulating arm of a training step: `amp.scale_loss(..., delay_unscale=True)` with no
step after it, beside the stepping `amp.scale_loss` of the same optimizers.

    if self.n_iter % accumulate == 0:
        with amp.scale_loss(loss, optimizers) as scaled_loss:
            scaled_loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    else:
        with amp.scale_loss(loss, optimizers, delay_unscale=True) as scaled_loss:
            scaled_loss.backward()

With `delay_unscale=True` apex neither unscaled nor checked for overflow at the block's exit: the
gradients stay scaled and add up until a later backward that steps. GradScaler's documented
accumulation is the same: `scaler.scale(loss).backward()` on every micro-batch, the scale constant
between updates, `unscale_`/`step`/`update` only where the optimizer steps. So such a block is a
micro-step with no step of its own, when the same function has another `amp.scale_loss` of the
same optimizers without `delay_unscale=True` (that one must find its step, or the plan fails).
What runs after a micro-step reads gradients apex had not unscaled either: no `unscale_` there.

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import List

import libcst as cst

from ampmigrate.analysis.statements import expression_key
from ampmigrate.rules.apex._amp_common import Step

_DELAY_UNSCALE_POSITION = 4  # scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, ...)


class DelayedMicroSteps:
    def _micro_step(self, step: Step, all_steps: List[Step]) -> bool:
        """`step` is an accumulating micro-step (see the module docstring); it is then recorded."""
        if not _delays_unscale(step.call):
            return False
        mine = [expression_key(o) for o in step.optimizers]
        for other in all_steps:
            if other is step or other.function is not step.function or _delays_unscale(other.call):
                continue
            if [expression_key(o) for o in other.optimizers] == mine:
                self._micro_steps().add(step)
                self._note(
                    f"`amp.scale_loss(..., delay_unscale=True)` at line {self._line(step.call)} accumulates: "
                    "`scaler.scale(loss).backward()` alone, the step and `scaler.update()` are where the "
                    f"optimizers step (after line {self._line(other.call)})"
                )
                return True
        return False

    def _micro_steps(self) -> set:
        if not hasattr(self, "_micro_step_set"):
            self._micro_step_set = set()
        return self._micro_step_set

    def _stepping(self, steps: List[Step]) -> List[Step]:
        """The steps that step an optimizer (not the accumulating micro-steps)."""
        micro = self._micro_steps()
        return [step for step in steps if step not in micro]


def _delays_unscale(call: cst.Call) -> bool:
    positional = 0
    for arg in call.args:
        if arg.star:
            return False
        if arg.keyword is None:
            if positional == _DELAY_UNSCALE_POSITION:
                return _is_true(arg.value)
            positional += 1
        elif arg.keyword.value == "delay_unscale":
            return _is_true(arg.value)
    return False


def _is_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
