"""The B side of a split apex setup whose training step is a trainer class's method
(engine/apex_trainer_class.py has the facts and the shape).

The class's constructor takes the GradScaler its constructing file creates where `amp.initialize`
was (a new `scaler` parameter, keyword-only beside defaults or `*args`, so a construction that
does not pass it fails at once), stores it first thing as `self.scaler`, and the step method reads
it there: `self.scaler.scale(loss).backward()`, `self.scaler.step(self.optimizer)`, the forward
pass under `torch.autocast(..., enabled=self.scaler.is_enabled())` (this file cannot know the
caller's opt level: the scaler carries it). The edits of the constructor are the checkpoint saver
class's (`_checkpoint_threading._HelperAccess`).
"""

from __future__ import annotations

from typing import Set

import libcst as cst

from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, _Planner
from ampmigrate.rules.apex._checkpoint_threading import _HelperAccess
from ampmigrate.rules.apex._flow import walk


def trainer_class(planner: _Planner, method: Scope) -> Scope:
    """The class scope of the trainer class whose method `method` scales a loss."""
    cls = method.parent
    name = cls.node.name.value
    if name not in planner.decisions or cls.parent is not planner.names.module_scope:
        raise Unfixable(NO_INIT_REASON)
    node = method.node
    if not isinstance(node, cst.FunctionDef) or node.decorators or not node.params.params:
        raise Unfixable(f"{NO_INIT_REASON} (`{name}.{getattr(node, 'name', cst.Name('?')).value}()` is not a plain method)")
    return cls


class TrainerAccess(_HelperAccess):
    """`self.scaler` in the trainer class's methods, set from a new constructor parameter."""

    def model_keys(self, function: Scope, depth: int = 0) -> Set[str]:
        """In a method: the instance attributes named like a model (`self.model`, `self.net`)
        that the class sets; what a forward pass calls."""
        if function.parent not in self.classes:
            return super().model_keys(function, depth)
        keys: Set[str] = set()
        for node in walk(function.parent.node):
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
                attr = node.attr.value
                if "model" in attr.lower() or "net" in attr.lower():
                    keys.add(f"self.{attr}")
        return keys

    def autocast_enabled(self, at: cst.CSTNode) -> str:
        return f"{self.expression(at)}.is_enabled()"  # the caller's opt level, carried by the scaler
