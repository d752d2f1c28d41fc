"""An input gradient computed by a method of the class that holds the scaler (issue 12).

The shape (the Adversarial Robustness Toolbox's estimators): the class sets apex up in `__init__`
(`self._model, self._optimizer = amp.initialize(...)`), trains in `fit()` with its own scaled
backward and `self._optimizer.step()`, and computes the gradient of a loss with respect to an
input in `loss_gradient()`:

    x_grad = torch.tensor(x).requires_grad_(True)
    loss = self._loss(self._model(x_grad), y)
    self._model.zero_grad()
    with amp.scale_loss(loss, self._optimizer) as scaled_loss:
        scaled_loss.backward()
    grads = x_grad.grad

No optimizer step belongs to that backward: it becomes `self.scaler.scale(loss).backward()` and
steps nothing, as the input-gradient helpers of other files do (engine/apex_input_gradients.py).
The input's gradient is scaled as apex scaled it, and the parameters' gradients it leaves are
scaled by the factor of the next scaled backward until `scaler.update()`.

It qualifies only when nothing could make that backward part of a training step:
- the method never steps the optimizer, and no method of the class calls it;
- after the backward, the method reads the `.grad` of a local input (`x_grad.grad`,
  `x_in[i].grad`; a loop variable such as `p` in `for p in model.parameters()` is no input);
- every method of the class that steps the optimizer scales a loss of its own with it, so no
  step is waiting for this method's gradients (else it is an optimizer wrapper's `backward()`,
  whose step the planner looks for in the other methods).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from ampmigrate.analysis.statements import expression_key, walk
from ampmigrate.rules.apex._amp_common import Step


def class_input_gradient(planner, step: Step, all_steps: List[Step]) -> bool:
    """`step` is an input gradient of a method of the scaler's class (see the module docstring);
    it is then noted, and steps nothing."""
    access = getattr(planner, "access", None)
    if getattr(access, "mode", None) != "attribute" or len(step.optimizers) != 1:
        return False
    function = step.function
    cls = getattr(access, "cls", None)
    if cls is None or function.parent is not cls or not isinstance(function.node, cst.FunctionDef):
        return False
    optimizer = step.optimizers[0]
    if not _on_self(optimizer, function.node):
        return False
    wanted = expression_key(optimizer)
    methods = planner._class_methods(cls)
    name = function.node.name.value
    if methods.get(name) is not function:
        return False
    for method in methods.values():
        stepped = any(expression_key(c.func.value) == wanted for c in planner._step_calls(method.node))
        if method is function and stepped:
            return False
        if stepped and not any(s.function is method and wanted in map(expression_key, s.optimizers) for s in all_steps):
            return False  # a step waiting for gradients scaled elsewhere: not an input gradient
        if _calls_method(method.node, name):
            return False
    read = _input_gradient_read(planner, step)
    if read is None:
        return False
    planner._note(
        f"`amp.scale_loss` at line {planner._line(step.call)} computes the gradient of an input "
        f"(`{planner.ctx.code(read).strip()}`) in `{name}()`, which steps nothing: "
        "`scaler.scale(loss).backward()` alone, scaled as apex scaled it"
    )
    return True


def _on_self(optimizer: cst.BaseExpression, func: cst.FunctionDef) -> bool:
    """`optimizer` is an attribute of the method's first parameter (`self._optimizer`)."""
    if not func.params.params or not isinstance(optimizer, cst.Attribute):
        return False
    root: cst.BaseExpression = optimizer
    while isinstance(root, cst.Attribute):
        root = root.value
    return isinstance(root, cst.Name) and root.value == func.params.params[0].name.value


def _calls_method(func: cst.FunctionDef, name: str) -> bool:
    """`func` calls `<anything>.name(...)` (a call through `self` or another instance)."""
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == name
        for node in walk(func.body)
    )


def _input_gradient_read(planner, step: Step) -> Optional[cst.Attribute]:
    """The first `<local>.grad` or `<local>[...].grad` read after the scaled backward, the local
    bound in the method only by plain assignments (no loop or comprehension variable)."""
    func = step.function.node
    end = planner._end(step.with_node)
    for node in walk(func.body):
        if not (isinstance(node, cst.Attribute) and node.attr.value == "grad") or planner._start(node) <= end:
            continue
        base = node.value.value if isinstance(node.value, cst.Subscript) else node.value
        if not isinstance(base, cst.Name):
            continue
        bindings = planner.names.bindings_of(base)
        if bindings and all(b.kind == "assign" and b.scope is step.function and not _parameters(b.value) for b in bindings):
            return node
    return None



def _parameters(value: Optional[cst.BaseExpression]) -> bool:
    """`value` collects parameters (`list(model.parameters())`, `amp.master_params(opt)`)."""
    return value is None or any(
        isinstance(node, cst.Attribute) and node.attr.value in ("parameters", "named_parameters", "master_params")
        for node in walk(value)
    )
