"""The calls of a module-level backward helper, made directly or through `functools.partial`.

lucidrains' trainers (denoising-diffusion-pytorch and its medical forks, stylegan2-pytorch's
single-class copies) keep the apex switch in one module-level function and bind its first
argument once per training method:

    def loss_backwards(fp16, loss, optimizer, **kwargs):
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward(**kwargs)
        else:
            loss.backward(**kwargs)

    class Trainer:
        def train(self):
            backwards = partial(loss_backwards, self.fp16)
            ...
            backwards(loss / self.gradient_accumulate_every, self.opt)
            ...
            self.opt.step()

The helper has no step and no forward pass: both are in the method that calls it. `helper_calls`
finds every call that runs the helper, with what each passes for each of its parameters (the
partial's bound arguments first); the planner then steps, puts autocast, and tests apex's `if`s
again in the caller (rules/apex/_method_windows.py, _caller_forward.py, _amp_steps.py), and the
scaler reaches the helper as a new parameter that the partial (or the call) passes
(rules/apex/_scaler_access.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import libcst as cst

from ampmigrate.analysis.statements import is_pure

if TYPE_CHECKING:
    from ampmigrate.engine.names import NameIndex, Scope


@dataclass(eq=False)
class HelperCall:
    call: cst.Call  # the call that runs the helper (`backwards(loss, opt)` or `loss_backwards(...)`)
    partial: Optional[cst.Call]  # `partial(loss_backwards, self.fp16)`, which then takes the scaler
    arguments: Dict[str, cst.BaseExpression]  # helper parameter -> what this call passes for it


def helper_calls(names: "NameIndex", function: "Scope") -> Optional[List[HelperCall]]:
    """Every call running the module-level function `function`, or None where a reference to it
    is something else (a value passed on, a partial kept on an object or called elsewhere) or an
    argument cannot be matched to a parameter plainly (`*args`, keywords given to the partial)."""
    func = function.node
    if not isinstance(func, cst.FunctionDef) or function.parent is None or function.parent.kind not in ("module", "function"):
        return None
    binding = next((b for b in function.parent.bindings.get(func.name.value, []) if b.node is func), None)
    if binding is None or len(function.parent.bindings.get(func.name.value, [])) != 1:
        return None
    params = func.params
    if params.posonly_params or isinstance(params.star_arg, cst.Param):
        return None  # positional-only parameters, or `*args` that positional arguments may reach
    positional = [p.name.value for p in params.params]
    keywords = {p.name.value for p in (*params.params, *params.kwonly_params)}
    found: List[HelperCall] = []
    for ref in names.references(binding):
        parent = names.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            arguments = _bind(parent.args, positional, keywords)
            if arguments is None:
                return None
            found.append(HelperCall(parent, None, arguments))
            continue
        partial = names.parent(parent) if isinstance(parent, cst.Arg) else None
        if not (
            isinstance(partial, cst.Call) and partial.args and partial.args[0] is parent and parent.keyword is None
            and "functools.partial" in names.qualified_names(partial.func)
        ):
            return None
        bound = partial.args[1:]
        if any(a.star or a.keyword is not None for a in bound) or not all(is_pure(a.value) for a in bound):
            return None
        calls = _calls_of_partial(names, partial)
        if calls is None:
            return None
        for call in calls:
            arguments = _bind([*bound, *call.args], positional, keywords)
            if arguments is None:
                return None
            found.append(HelperCall(call, partial, arguments))
    return found or None


def _calls_of_partial(names: "NameIndex", partial: cst.Call) -> Optional[List[cst.Call]]:
    """`name = partial(...)` in a function, every use of `name` there a call: those calls."""
    assign = names.parent(partial)
    if not (isinstance(assign, cst.Assign) and assign.value is partial and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if not isinstance(target, cst.Name):
        return None
    scope = names.scope_of(target)
    if scope.kind != "function" or len(scope.bindings.get(target.value, [])) != 1:
        return None
    binding = scope.bindings[target.value][0]
    calls: List[cst.Call] = []
    for load in names.references(binding):
        call = names.parent(load)
        if not (isinstance(call, cst.Call) and call.func is load) or names.scope_of(load) is not scope:
            return None
        calls.append(call)
    return calls


def _bind(args, positional: List[str], keywords) -> Optional[Dict[str, cst.BaseExpression]]:
    bound: Dict[str, cst.BaseExpression] = {}
    index = 0
    for arg in args:
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= len(positional):
                return None
            bound[positional[index]] = arg.value
            index += 1
        elif arg.keyword.value in keywords:
            bound[arg.keyword.value] = arg.value
        # other keywords go to the helper's `**kwargs`
    return bound
