"""What else touches the gradients between the scaled backward and the step.

apex unscaled the gradients when the `amp.scale_loss` block ended; GradScaler keeps them scaled
until `unscale_`/`step`. `_amp_steps` puts `unscale_` before the reads it knows (a clip,
`amp.master_params`, a gradient-norm helper). Two more things can sit in that window:

- a call into this file's own code that reads `.grad` (`fgm.attack()` of an FGM class defined
  here, `log_grads(model)`): it would see gradients multiplied by the loss scale. Unless every
  read is scale-invariant (FGM's `epsilon * grad / norm` with `norm = torch.norm(grad)`,
  `grad.sign()`: a power-of-two scale changes neither), `_amp_steps._plan_unscale` puts
  `scaler.unscale_` before the statement that makes the call, where apex had unscaled, and
  refuses where that cannot run once per step (a read on every micro-step);
- a plain `x.backward()` (see `_amp_steps._plain_backwards`), which the fix scales too: that is
  only right while the gradients are still scaled, so an `unscale_` the fix puts before it
  refuses the migration.

Code in other files is not seen (an FGM imported from `callback/adversarial.py`).

A mixin of the planner (`_amp_migration._Planner`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.rules.apex._amp_common import Unfixable


class WindowReaders:
    def _reads_scaled_gradients(self, call: cst.Call) -> bool:
        """`call` runs this file's code that reads `.grad` in a way the loss scale changes: it gets
        `scaler.unscale_` before it, where apex had unscaled (`_amp_steps._plan_unscale`)."""
        body = self._own_callee(call)
        if body is None:
            return False
        reads = [n for n in walk(body, into_scopes=True) if self._reads_grad_attribute(n)]
        return bool(reads) and not _scale_invariant(self.names, body, reads)

    def _check_plain_backwards_before_unscale(self, plain, points: List[cst.CSTNode]) -> None:
        for line, loss, _ in plain:
            for point in points:
                if self._function_scope(point) is self._function_scope(line) and self._start(point) < self._start(line):
                    raise Unfixable(
                        f"`{loss.value}.backward()` at line {self._line(line)} adds gradients after they are unscaled "
                        f"at line {self._line(point)} and before the step; the fix scales such a backward only while "
                        "the gradients are still scaled"
                    )

    # ---- resolving a call to this module's code
    def _reads_grad_attribute(self, node: cst.CSTNode) -> bool:
        if not (isinstance(node, cst.Attribute) and node.attr.value == "grad"):
            return False
        parent = self.names.parent(node)
        # `p.grad is None` / `is not None` tests do not see the scale
        if isinstance(parent, cst.Comparison) and parent.left is node and all(
            isinstance(c.operator, (cst.Is, cst.IsNot)) and isinstance(c.comparator, cst.Name)
            and c.comparator.value == "None" for c in parent.comparisons
        ):
            return False
        # writes (`p.grad = None`) and deletions read nothing
        if isinstance(parent, cst.AssignTarget) or isinstance(parent, cst.Del):
            return False
        return True

    def _own_callee(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The def in this module that `call` runs: `f(...)` of a module-level function,
        `self.m(...)` of the same class, `obj.m(...)` where `obj` is only ever bound to
        `C(...)` of a module-level class `C` in the calling function."""
        func = call.func
        function = self._function_scope(call)
        if isinstance(func, cst.Name):
            if func.value in function.bindings and function.kind != "module":
                return None
            return self._module_defs().get(func.value)
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return None
        method = self._self_method_call(call, function)
        if method is not None:
            return method.node
        cls = self._instance_class(func.value, function)
        if cls is None:
            return None
        for statement in cls.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == func.attr.value:
                return statement
        return None

    def _module_defs(self) -> Dict[str, cst.CSTNode]:
        found: Dict[str, cst.CSTNode] = {}
        for statement in self.module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                found[statement.name.value] = statement
        return found

    def _instance_class(self, name: cst.Name, function) -> Optional[cst.ClassDef]:
        """The module-level class whose instance `name` is, when every assignment to it in the
        calling function (or the module) is `name = C(...)`."""
        classes = set()
        for scope in (function, function.parent):
            if scope is None:
                continue
            for node in walk(scope.node, into_scopes=False):
                if isinstance(node, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name.value for t in node.targets
                ):
                    value = node.value
                    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
                        return None
                    classes.add(value.func.value)
            if classes:
                break
        if len(classes) != 1:
            return None
        cls = self._module_defs().get(classes.pop())
        return cls if isinstance(cls, cst.ClassDef) else None


_NORMS = ("norm", "vector_norm")


def _scale_invariant(names, body: cst.CSTNode, reads: List[cst.Attribute]) -> bool:
    """Every gradient read in `body` is a norm assigned to a name, `g.sign()`, or the numerator
    of a division by such a norm name."""
    norm_names: Set[str] = set()
    inside_norms: Set[cst.CSTNode] = set()
    for node in walk(body, into_scopes=True):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            call = node.value
            if _is_norm_call(call):
                norm_names.add(node.targets[0].target.value)
                inside_norms.update(walk(call, into_scopes=True))
    for read in reads:
        if read in inside_norms:
            continue
        parent = names.parent(read)
        if isinstance(parent, cst.Attribute) and parent.attr.value == "sign" and isinstance(names.parent(parent), cst.Call):
            continue
        if not _divided_by_norm(names, read, norm_names):
            return False
    return True


def _is_norm_call(call: cst.BaseExpression) -> bool:
    """`torch.norm(g)`, `torch.linalg.norm(g)`, `g.norm()` (any p: a norm scales with its argument)."""
    if not isinstance(call, cst.Call):
        return False
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _NORMS:
        return True
    return isinstance(func, cst.Name) and func.value in _NORMS


def _divided_by_norm(names, read: cst.CSTNode, norm_names: Set[str]) -> bool:
    child, node = read, names.parent(read)
    while node is not None and not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        if (
            isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide)
            and node.left is child and isinstance(node.right, cst.Name) and node.right.value in norm_names
        ):
            return True
        if not isinstance(node, (cst.BinaryOperation, cst.Attribute, cst.Subscript, cst.SubscriptElement, cst.Index)):
            return False
        if isinstance(node, cst.BinaryOperation) and not isinstance(node.operator, (cst.Multiply, cst.Divide)):
            return False
        child, node = node, names.parent(node)
    return False
