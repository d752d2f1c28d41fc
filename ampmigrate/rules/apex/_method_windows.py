"""Training steps that span the methods of one class (issue 12: setups inside a class).

Two shapes of class-based apex code put the backward/step window across methods:

- **A helper that reads the gradients**, called between the backward and the step
  (`batch_grad_norm = self.rescale_gradients()`, where `rescale_gradients` clips
  `amp.master_params(self.optimizer)`): the helper call is a gradient read like a clip, so
  `scaler.unscale_(optimizer)` goes before the statement that calls it. Only methods of the same
  class, called on `self`, count; when a helper that reads `amp.master_params` is also called
  outside every window, the migration is refused (there the gradients would still be scaled).
- **An optimizer wrapper** (`backward(loss)` with `amp.scale_loss(loss, self._optimizer)` and a
  separate `step()` that calls `self._optimizer.step()`): when no step follows the scaled backward
  in its own method, the step is looked for in the other methods of the class. It must be the
  only method of the class that steps that optimizer, nothing may read the gradients after the
  backward in its own method (the wrapper's caller may run it several times per step), and the
  step method's gradient reads before the step get `scaler.unscale_` as usual. A condition the
  backward ran under that chooses apex (`if self._fp16 == "amp":`) is tested again at the step
  only when it reads nothing but `self` and module-level names.

A mixin of the planner (`_amp_migration._Planner`), beside `_amp_steps.StepRewrites`.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import body_of, containing_block, expression_key, following, is_pure, walk
from ampmigrate.api import CLIP_GRAD
from ampmigrate.engine.fixer import _is_docstring
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import Step, Unfixable
from ampmigrate.rules.apex._amp_options import literal_value
from ampmigrate.rules.apex._scalerless_calls import argument_values, evaluate


def _first_param(scope: Scope) -> Optional[str]:
    func = scope.node
    if not isinstance(func, cst.FunctionDef) or not func.params.params:
        return None
    return func.params.params[0].name.value


def _plain_method(scope: Scope) -> bool:
    """A method called on the instance: a def in a class body without decorators."""
    func = scope.node
    return (
        isinstance(func, cst.FunctionDef)
        and scope.parent is not None
        and scope.parent.kind == "class"
        and not func.decorators
        and _first_param(scope) is not None
    )


def _first_statement(func: cst.FunctionDef) -> cst.BaseStatement:
    """Where a new first statement of `func` goes: before its first one after a docstring (the
    scaler exists before anything `__init__` calls can use it)."""
    body = list(func.body.body)
    return body[1] if len(body) > 1 and _is_docstring(body[0]) else body[0]


def _argument_for(call: cst.Call, positional: List[str], name: str, method: bool) -> Optional[cst.BaseExpression]:
    """The argument `call` passes for parameter `name` (`positional`: the function's positional
    parameters, `self` first when `method`); None when it is not passed plainly."""
    if any(arg.star for arg in call.args):
        return None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    index = positional.index(name) - (1 if method else 0) if name in positional else -1
    plain = [arg for arg in call.args if arg.keyword is None]
    return plain[index].value if 0 <= index < len(plain) else None


class MethodWindows:
    def _init_windows(self) -> None:
        self._helper_masters: Dict[cst.CSTNode, List[cst.Call]] = {}  # helper call -> its master_params
        self._helpers_read: Dict[Scope, Set[cst.CSTNode]] = {}  # helper method -> its calls seen in windows
        self._helper_calls_covered: Set[cst.CSTNode] = set()  # those with `unscale_` before them
        self._step_methods: Dict[Step, Scope] = {}  # a scaled backward -> the method that steps
        self._step_starts: Dict[Step, cst.CSTNode] = {}  # ... and the call after which it steps
        # a backward helper's scaled backward -> what all its calls pass alike for a parameter,
        # and the statements of those calls
        self._helper_arguments: Dict[Step, Dict[str, cst.BaseExpression]] = {}
        # a module-level function's scaled backward, called once by the function that steps
        # (`_caller_steps`) -> what that call passes for each parameter (pure arguments only)
        self._caller_arguments: Dict[Step, Dict[str, cst.BaseExpression]] = {}
        self._helper_starts: Dict[Step, List[cst.CSTNode]] = {}
        self._detached_checked = False

    # ---- the class's methods
    def _class_methods(self, cls: Scope) -> Dict[str, Scope]:
        methods: Dict[str, Scope] = {}
        for scope in self.names.scopes:
            if scope.parent is cls and scope.kind == "function" and isinstance(scope.node, cst.FunctionDef):
                name = scope.node.name.value
                methods[name] = None if name in methods else scope  # a name defined twice: neither
        return {name: scope for name, scope in methods.items() if scope is not None}

    def _self_method_call(self, node: cst.CSTNode, function: Scope) -> Optional[Scope]:
        """The method of `function`'s class that `node` calls as `self.m(...)`, if any."""
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            return None
        receiver = node.func.value
        self_name = _first_param(function) if _plain_method(function) else None
        if self_name is None or not (isinstance(receiver, cst.Name) and receiver.value == self_name):
            return None
        method = self._class_methods(function.parent).get(node.func.attr.value)
        if method is None or method is function or not _plain_method(method):
            return None
        if _first_param(method) != self_name:
            return None
        return method

    # ---- helpers read between the backward and the step
    def _helper_reads(self, node: cst.CSTNode, step: Step, master_refs) -> Optional[List[str]]:
        """The optimizers whose gradients `self.helper(...)` reads (a clip or `amp.master_params`
        in the helper's own body), or None when `node` is no such call."""
        method = self._self_method_call(node, self._function_scope(node))
        if method is None:
            return None
        masters = [n for n in walk(method.node) if n in master_refs]
        clips = [
            n for n in walk(method.node)
            if isinstance(n, cst.Call) and self.names.qualified_names(n.func) & CLIP_GRAD
        ]
        if not masters and not clips:
            return None
        optimizers: List[str] = []
        for call in masters:
            args = call.args
            if len(args) != 1 or args[0].keyword is not None:
                raise Unfixable(f"`amp.master_params` at line {self._line(call)} is not called with one optimizer")
            optimizers.append(self.ctx.code(args[0].value).strip())
        if clips and not masters:
            optimizers = [self.ctx.code(o).strip() for o in step.optimizers]
        self._helper_masters.setdefault(node, []).extend(masters)
        self._helpers_read.setdefault(method, set()).add(node)
        return list(dict.fromkeys(optimizers))

    def _check_helpers_covered(self, covered: Set[cst.Call]) -> None:
        """A helper that reads `amp.master_params` must be called only inside windows."""
        for method in self._helpers_read:
            name = method.node.name.value
            inner = [n for n in walk(method.node) if n in covered]
            if not inner:
                continue
            for ref in self._attribute_refs(name):
                call = self.names.parent(ref)
                if not (isinstance(call, cst.Call) and call.func is ref) or call not in self._helper_calls_covered:
                    raise Unfixable(
                        f"`{name}()` reads `amp.master_params` and is also used at line {self._line(ref)}, outside "
                        "the backward/step window where the fix puts `scaler.unscale_`"
                    )

    def _attribute_refs(self, name: str) -> List[cst.Attribute]:
        return [
            n for n in walk(self.module, into_scopes=True)
            if isinstance(n, cst.Attribute) and n.attr.value == name
        ]

    # ---- the scaler on a wrapper class, apart from `amp.initialize`
    def _detached_class(self, scopes: List[Scope]):
        """(class, its `__init__`) when every scope is a plain method of one class, in this file,
        that `amp.initialize`'s function is not part of, and that class has a plain `__init__`
        without `return` (every instance gets the scaler there)."""
        classes = {id(s.parent): s.parent for s in scopes if _plain_method(s)}
        if len(classes) != 1 or not all(_plain_method(s) for s in scopes):
            return None
        (cls,) = classes.values()
        if any(a is cls.node for a in self.names.ancestors(self.init_line)):
            return None
        init = self._class_methods(cls).get("__init__")
        if init is None or not _plain_method(init) or any(isinstance(n, cst.Return) for n in walk(init.node)):
            return None
        if not isinstance(init.node.body, cst.IndentedBlock):
            return None
        return cls, init

    def _check_detached(self, step: Step) -> None:
        """With the scaler always enabled on the wrapper, the scaled backward must run under a
        test of `self` that chooses between it and a plain backward (the test every new call then
        repeats), and the scaler's arguments must mean the same in `__init__`."""
        if getattr(self.access, "detached_init", None) is None:
            return
        if not any(self._chooses_backward(b) for b in step.branches):
            raise Unfixable(
                f"`amp.initialize` is in `{self.home.node.name.value}()`, `amp.scale_loss` in "
                f"`{step.function.node.name.value}()` of `{self.access.cls.node.name.value}`, with no test there of "
                "whether apex is on: the scaler cannot be enabled exactly when apex was"
            )
        self._check_guard_portable(step)
        if self._detached_checked:
            return
        self._detached_checked = True
        # The spec's note that O0 disables the scaler does not hold for an always-enabled one.
        self.unsafe[:] = [u.replace("under O0 the scaler and autocast are disabled; ", "") for u in self.unsafe]
        for conjunct in self.spec.enabled:
            if conjunct.code == "False":
                raise Unfixable("`amp.initialize(..., enabled=False)`: apex was off")
            self.unsafe.append(
                f"the scaler on `{self.access.cls.node.name.value}` is always enabled where apex ran, "
                f"though apex's `{conjunct.code}` (tested in `{self.home.node.name.value}()`) could turn loss scaling off"
            )
        if self.spec.run_time_scale is not None:
            # `init_scale=... args.loss_scale ...` reads the builder's locals: assume a dynamic scale
            names, reason = self.spec.run_time_scale
            self.spec.keywords = [(k, v) for k, v in self.spec.keywords if k not in names]
            self.notes[:] = [n for n in self.notes if not n.startswith(reason.split(" is only")[0])]
            self.unsafe.append(reason)
        for keyword, value in self.spec.keywords:
            try:
                literal_value(cst.parse_expression(value))
            except ValueError:
                raise Unfixable(
                    f"the scaler's `{keyword}={value}` is computed in `{self.home.node.name.value}()`, but the scaler "
                    f"is created in `{self.access.cls.node.name.value}.__init__`"
                )

    def _place_detached(self, creation: str) -> None:
        init = self.access.detached_init.node
        self.builder.insert_before(_first_statement(init), self.ctx.parse_statement(creation + "\n"))
        self._note(
            f"the scaler is created in `{self.access.cls.node.name.value}.__init__` (apex's `amp.initialize` ran in "
            f"`{self.home.node.name.value}()`), always enabled: its uses test again what chose apex"
        )

    def _default_init(self, access) -> Optional[Scope]:
        """The class's `__init__` when `amp.initialize` is in another of its methods (`setup()`,
        `enable_amp()`): an instance that never calls that method gets a disabled scaler from
        `__init__` (it passes `step` through, makes `unscale_`/`update` no-ops, and autocast,
        which follows it, stays off), so the fp32 path never meets a missing attribute."""
        if access.mode != "attribute" or access.detached_init is not None:
            return None
        if not isinstance(self.home.node, cst.FunctionDef) or self.home.node.name.value == "__init__":
            return None
        init = self._class_methods(access.cls).get("__init__")
        if init is None or not _plain_method(init) or not isinstance(init.node.body, cst.IndentedBlock):
            return None
        if any(isinstance(n, cst.Return) for n in walk(init.node)):
            return None
        return init

    def _disabled_default(self, torch: str) -> None:
        init = getattr(self.access, "default_init", None)
        if init is None:
            return
        access = self.access
        self_name = _first_param(init)
        cuda = self.ctx.string("cuda").value
        statement = f"{self_name}.{access.name} = {torch}.amp.GradScaler({cuda}, enabled=False)"
        # First: `__init__` may itself call the method that replaces it.
        self.builder.insert_before(_first_statement(init.node), self.ctx.parse_statement(statement + "\n"))
        self._note(
            f"`__init__` creates a disabled scaler, which `{self.home.node.name.value}()` replaces where apex was "
            "initialized"
        )

    # ---- one unscale_ per optimizer and step
    def _drop_double_unscale(self, order, inserts, readers, master_refs) -> None:
        """Two `unscale_` of one optimizer that can both run in one step (the first in an `if` arm
        that does not exclude the second: `if fp16: params = amp.master_params(opt)` then
        `clip_grad_norm_(params, ...)`) would raise at the second (GradScaler unscales once per
        step). When the first only collects `amp.master_params` into a name (no gradient is read
        yet), it goes and the later one stays; otherwise the migration is refused."""
        for index, first in enumerate(order):
            for later in order[index + 1:]:
                # The same optimizer before the same step (reads before two different steps, even in
                # two functions, each get their own `unscale_`).
                shared = [o for o, s in inserts[first] if (o, s) in [(p, t) for p, t in inserts[later]]]
                if not shared or self._dominates(first, later) or self._exclusive(first, later):
                    continue
                collected = readers.get(first, [])
                if collected and all(self._collects_master(r, master_refs) for r in collected):
                    inserts[first] = [(o, s) for o, s in inserts[first] if o not in shared]
                    continue
                raise Unfixable(
                    f"the gradients of `{shared[0]}` are read at lines {self._line(first)} and {self._line(later)}, "
                    "both of which can run in one step; GradScaler unscales once per step, so `scaler.unscale_` "
                    "cannot go before each"
                )

    def _collects_master(self, reader: cst.CSTNode, master_refs) -> bool:
        if reader not in master_refs:
            return False
        small = self.names.parent(reader)
        return isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is reader

    def _exclusive(self, first: cst.CSTNode, later: cst.CSTNode) -> bool:
        """`first` and `later` lie in different arms of one `if`."""

        def arms(node: cst.CSTNode) -> Dict[int, str]:
            found: Dict[int, str] = {}
            child = node
            parent = self.names.parents.get(child)
            while parent is not None:
                if isinstance(parent, cst.If) and child is not parent.test:
                    found[id(parent)] = "body" if child is parent.body else "orelse"
                child, parent = parent, self.names.parents.get(parent)
            return found

        mine, theirs = arms(first), arms(later)
        return any(theirs.get(key, arm) != arm for key, arm in mine.items())

    # ---- the step in another method of the class
    def _sibling_steps(self, step: Step, optimizer: cst.BaseExpression) -> List[cst.Call]:
        """`self._optimizer.step()` in the one other method of the class that steps it."""
        function = step.function
        if not _plain_method(function) or not isinstance(optimizer, cst.Attribute):
            return []
        if getattr(self.access, "mode", None) != "attribute":
            return []
        self_name = _first_param(function)
        root = optimizer
        while isinstance(root, cst.Attribute):
            root = root.value
        if not (isinstance(root, cst.Name) and root.value == self_name):
            return []
        wanted = expression_key(optimizer)
        found: Dict[Scope, List[cst.Call]] = {}
        for method in self._class_methods(function.parent).values():
            if method is function:
                continue
            calls = [c for c in self._step_calls(method.node) if expression_key(c.func.value) == wanted]
            if calls:
                found[method] = calls
        if not found:
            return []
        if len(found) > 1:
            raise Unfixable(
                f"`{self.ctx.code(optimizer).strip()}.step()` is called in several methods ("
                + ", ".join(f"`{m.node.name.value}()`" for m in found)
                + "); the fix cannot tell which one ends the training step"
            )
        (method, calls), = found.items()
        if not _plain_method(method) or _first_param(method) != self_name:
            raise Unfixable(f"`{method.node.name.value}()` steps the optimizer but is not a plain method on `{self_name}`")
        self._check_nothing_read_after(step, method)
        self._drop_guards_the_stepper_passes(step, method)
        self._check_guard_portable(step)
        self._step_methods[step] = method
        self._note(
            f"`amp.scale_loss` is in `{function.node.name.value}()` and the optimizer steps in "
            f"`{method.node.name.value}()`: the scaler is an attribute of the instance, used by both"
        )
        return calls

    # ---- the step in the function that calls the backward's function
    def _caller_steps(self, step: Step, optimizer: cst.BaseExpression) -> List[cst.Call]:
        """`optimizer.step()` after the one call of the backward's function (a method called on
        `self`, or a function of this module), in the function that calls it: the transformers
        `Trainer` of 2020 scales the loss in `_training_step(model, inputs, optimizer)` and clips
        and steps in `train()` after `tr_loss += self._training_step(...)`. The optimizer must be a
        parameter of the backward's function that the call passes under the same name."""
        function = step.function
        func = function.node
        if isinstance(func, cst.FunctionDef) and function in getattr(self.access, "helper_calls", {}):
            return self._helper_caller_steps(step, optimizer)
        if not isinstance(func, cst.FunctionDef) or not isinstance(optimizer, cst.Name):
            return []
        params = func.params
        positional = [p.name.value for p in (*params.posonly_params, *params.params)]
        if optimizer.value not in positional + [p.name.value for p in params.kwonly_params]:
            return []
        call = self._only_call_of(function)
        if call is None:
            return []
        caller = self._function_scope(call)
        if (
            caller not in self.scaler_scopes and caller.node is not getattr(self.home, "node", None)
            and caller not in getattr(self.access, "threaded", ())  # the scaler is passed to it
        ):
            return []
        argument = _argument_for(call, positional, optimizer.value, method=_plain_method(function))
        if argument is None or self.ctx.code(argument).strip() != optimizer.value:
            return []
        statement = self.names.statement_of(call)
        wanted = expression_key(argument)
        calls: List[cst.Call] = []
        for following_statement in following(self.names, statement, out_of_loops=True):
            calls = [c for c in self._step_calls(following_statement) if expression_key(c.func.value) == wanted]
            if calls:
                break
        if not calls:
            return []
        self._check_nothing_read_after(step, caller)
        self._step_methods[step] = caller
        self._step_starts[step] = statement
        if not _plain_method(function):
            every = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
            passed = {name: _argument_for(call, positional, name, method=False) for name in every}
            self._caller_arguments[step] = {k: v for k, v in passed.items() if v is not None and is_pure(v)}
        self._note(
            f"`amp.scale_loss` is in `{func.name.value}()`, called at line {self._line(call)} of "
            f"`{caller.node.name.value}()`, which steps the optimizer after the call"
        )
        return calls

    def _helper_caller_steps(self, step: Step, optimizer: cst.Name) -> List[cst.Call]:
        """A module-level backward helper that methods of the scaler's class call (_helper_calls.py):
        at each call, the step of what it passes for the optimizer, after it in the caller."""
        found: List[cst.Call] = []
        starts: List[cst.CSTNode] = []
        for helper_call in self.access.helper_calls[step.function]:
            caller = self._function_scope(helper_call.call)
            argument = helper_call.arguments.get(optimizer.value) if isinstance(optimizer, cst.Name) else None
            if argument is None and self._same_in_caller(step.function, optimizer, caller):
                argument = optimizer  # a closure's `self.optimizer`: the caller's `self` is the closure's
            if not isinstance(argument, (cst.Name, cst.Attribute)) or not is_pure(argument):
                return []
            statement = self.names.statement_of(helper_call.call)
            wanted = expression_key(argument)
            calls: List[cst.Call] = []
            for following_statement in following(self.names, statement, out_of_loops=True):
                calls = [c for c in self._step_calls(following_statement) if expression_key(c.func.value) == wanted]
                if calls:
                    break
            if not calls:
                calls = self._step_after_outer_loop(caller, statement, wanted)
            if not calls:
                return []
            self._check_nothing_read_after(step, caller)
            found.extend(c for c in calls if c not in found)
            starts.append(statement)
        self._step_methods[step] = self._function_scope(starts[0])
        self._helper_starts[step] = starts
        self._helper_arguments[step] = self._common_arguments(step)
        callers = list(dict.fromkeys(f"`{self._function_scope(s).node.name.value}()`" for s in starts))
        self._note(
            f"`amp.scale_loss` is in `{step.function.node.name.value}()`; each call of it (in {', '.join(callers)}) is "
            "followed by the step of the optimizer it passes, which goes through the scaler"
        )
        return found

    def _same_in_caller(self, helper: Scope, expression: cst.BaseExpression, caller: Scope) -> bool:
        """`expression` (`self.optimizer`) reads, in the closure `helper`, a name of an enclosing
        function that `caller` sees bound the same way: it denotes the same object there."""
        root = expression
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or helper.parent is None or root.value in helper.bindings:
            return False
        outer = self.names.lookup(root.value, helper.parent)
        return bool(outer) and self.names.lookup(root.value, caller) is outer

    def _step_after_outer_loop(self, caller: Scope, statement: cst.CSTNode, wanted: str) -> List[cst.Call]:
        """The step on its own line right after the caller's outermost loop around the call, in
        the caller's body: an accumulation loop (stylegan2's `for i in gradient_accumulate_contexts(...)`)
        whose micro-batches the one step after it takes, as apex's patched step did."""
        func = caller.node
        if not isinstance(func, cst.FunctionDef) or not isinstance(func.body, cst.IndentedBlock):
            return []
        body = list(func.body.body)
        loop = next((a for a in self.names.ancestors(statement) if any(a is s for s in body)), None)
        if not isinstance(loop, (cst.For, cst.While)) or loop.orelse is not None:
            return []
        for later in body[body.index(loop) + 1 :]:
            calls = [c for c in self._step_calls(later) if expression_key(c.func.value) == wanted]
            if calls:
                return calls if isinstance(later, cst.SimpleStatementLine) else []
            if isinstance(later, (cst.For, cst.While)):
                return []  # another loop first: not this accumulation's step
        return []

    def _common_arguments(self, step: Step) -> Dict[str, cst.BaseExpression]:
        """What every call of the helper passes alike for a parameter (`fp16` -> `self.fp16`):
        only those parameters can be spelled in the callers (`_in_caller`)."""
        calls = self.access.helper_calls[step.function]
        common: Dict[str, cst.BaseExpression] = {}
        for name, value in calls[0].arguments.items():
            key = expression_key(value)
            if is_pure(value) and all(name in c.arguments and expression_key(c.arguments[name]) == key for c in calls):
                common[name] = value
        return common

    def _only_call_of(self, function: Scope) -> Optional[cst.Call]:
        """The single call of `function` in this module (`self.f(...)` from a method of its class,
        or `f(...)`), None when it is used any other way or called more than once."""
        name = function.node.name.value
        if _plain_method(function):
            refs = self._attribute_refs(name)
            calls = [
                self.names.parent(r) for r in refs
                if isinstance(self.names.parent(r), cst.Call) and self.names.parent(r).func is r
                and self._self_method_call(self.names.parent(r), self._function_scope(r)) is function
            ]
            if len(calls) != 1 or len(refs) != 1:
                return None
            return calls[0]
        if function.parent is None or function.parent.kind != "module":
            return None
        # The loads of the def's own binding: `scaled_loss.backward()` or `model.train()` is not a
        # use of a helper named `backward` or `train`, and a rebinding of the name is not the def.
        bindings = function.parent.bindings.get(name, [])
        if len(bindings) != 1 or bindings[0].node is not function.node or name in self.names.dunder_all():
            return None
        refs = self.names.references(bindings[0])
        if len(refs) != 1:
            return None
        call = self.names.parent(refs[0])
        if not (isinstance(call, cst.Call) and call.func is refs[0]):
            return None
        return call

    def _check_nothing_read_after(self, step: Step, method: Scope) -> None:
        """Nothing after the backward reads gradients before the stepping method runs, unless the
        backward's own method calls it there, once, as a statement of the same block (DeepGNN's
        `clip_grad_norm_(amp.master_params(...))` then `self._apex_step()`): then what comes
        before that call runs once per step, as it would with the step written inline."""
        master_calls = {r.call for r in self.refs if r.api == "master_params" and r.call is not None}
        stepper_call = self._only_call_of(method) if _plain_method(method) else None
        stepper_line = self.names.statement_of(stepper_call) if stepper_call is not None else None
        same_block = stepper_line is not None and containing_block(self.names, stepper_line) is containing_block(
            self.names, step.with_node
        )
        statements = list(following(self.names, step.with_node, out_of_loops=True))
        if (
            same_block and stepper_line in statements and self._function_scope(stepper_call) is step.function
            and isinstance(stepper_line, cst.SimpleStatementLine) and len(stepper_line.body) == 1
            and isinstance(stepper_line.body[0], cst.Expr) and stepper_line.body[0].value is stepper_call
        ):
            return
        for statement in statements:
            for node in walk(statement):
                if node in master_calls or self._reads_gradients(node) or self._self_method_call(node, step.function):
                    raise Unfixable(
                        f"line {self._line(node)} follows the backward in `{step.function.node.name.value}()`, "
                        f"but the optimizer steps in `{method.node.name.value}()`; the fix cannot tell how often "
                        "it runs per step"
                    )

    def _drop_guards_the_stepper_passes(self, step: Step, method: Scope) -> None:
        """An `if` around `amp.scale_loss` that tests parameters of its method (inferno's
        `apply_model_and_loss(self, inputs, target, backward=True, mode=None)` with `if backward:`)
        holds wherever the step's method calls it with literals that pass it (`backward=True`):
        it is no condition there, so the step does not test it again."""
        calls = [node for node in walk(method.node) if self._self_method_call(node, method) is step.function]
        params = step.function.node.params
        bindings = step.function.bindings
        # the parameters the method never rebinds: their value at the test is the call's
        names = {p.name.value for p in (*params.params, *params.kwonly_params)[1:] if len(bindings.get(p.name.value, [])) == 1}
        if not calls:
            return
        kept = []
        for branch in step.branches:
            reads = {n.value for n in walk(branch.test) if isinstance(n, cst.Name)}
            if reads & names and all(
                (values := argument_values(step.function.node, call, method=True)) is not None
                and evaluate(branch.test, values) is branch.taken
                for call in calls
            ):
                continue
            kept.append(branch)
        step.branches = kept

    def _check_guard_portable(self, step: Step) -> None:
        """The `if`s around `amp.scale_loss` may be tested again in the step's method: they must
        read only `self` and module-level names."""
        self_name = _first_param(step.function)
        local = set(step.function.bindings) - {self_name}
        for branch in step.branches:
            for node in walk(branch.test):
                if isinstance(node, cst.Name) and node.value in local:
                    raise Unfixable(
                        f"`amp.scale_loss` runs under `if {self.ctx.code(branch.test).strip()}`, which reads "
                        f"`{node.value}`, a local of `{step.function.node.name.value}()`, and the optimizer "
                        "steps in another method"
                    )

    def _loss_from_wrapper_caller(self, step: Step) -> bool:
        """An optimizer wrapper's `backward(loss)`: the forward pass runs in its callers, which this
        file may not hold. The scaler part is migrated as an unsafe fix that says where autocast
        goes (without it the forward runs in float32 where apex ran float16)."""
        if step not in self._step_methods or not isinstance(step.loss, cst.Name) or step in self._helper_arguments:
            return False  # (a backward helper's caller is in this file: _caller_forward.py wraps it)
        params = step.function.node.params
        if step.loss.value not in {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}:
            return False
        if any(isinstance(n, (cst.Assign, cst.AugAssign)) and step.loss.value in {
            t.target.value for t in getattr(n, "targets", ()) if isinstance(t.target, cst.Name)
        } for n in walk(step.function.node)):
            return False
        name = step.function.node.name.value
        self.unsafe.append(
            f"the forward pass runs in the callers of `{name}()`, not here: without "
            f"`torch.autocast(\"cuda\", dtype=torch.float16)` around it there, it runs in float32 where apex ran float16"
        )
        return True

    def _window_statements(self, step: Step) -> Iterator[cst.BaseStatement]:
        """The statements after the scaled backward up to (and including) the step's: in the
        backward's own method, then, when the step is in another method, that method's body."""
        yield from following(self.names, step.with_node, out_of_loops=True)
        for start in self._helper_starts.get(step, ()):
            yield from following(self.names, start, out_of_loops=True)
        method = self._step_methods.get(step)
        start = self._step_starts.get(step)
        if start is not None:
            yield from following(self.names, start, out_of_loops=True)
        elif method is not None:
            yield from body_of(method.node.body)

    def _stop_node(self, step: Step, node: cst.CSTNode) -> cst.CSTNode:
        """The function to stop at when collecting the `if`s around `node` (in the step's method
        or the backward's)."""
        if step in self._helper_starts:
            return self._function_scope(node).node  # the helper, or the caller `node` is in
        method = self._step_methods.get(step)
        if method is not None and any(a is method.node for a in self.names.ancestors(node)):
            return method.node
        return step.function.node
