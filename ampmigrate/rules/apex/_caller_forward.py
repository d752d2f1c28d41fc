"""The forward pass in the methods that call the loss's method: `self.optimize(loss)`.

    class Trainer:
        def optimize(self, loss):
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()

        def mt_step(self, batch):
            out = self.model(batch.x)
            loss = F.cross_entropy(out, batch.y)
            self.optimize(loss)

The loss is a parameter of the method that scales it (or computed from it there, as
`loss = loss / accumulation_steps`), so there is no forward pass before
`amp.scale_loss` to put under autocast: it is in each method that calls `self.optimize(...)`.
Where every use of the method's name in this file is such a call, `self.<method>(...)` in a method
of its class or of a subclass of it in this file (which does not define the method again), each
caller gets the autocast region of the loss it passes, found as in the scaling method itself
(`_regions.autocast_regions` from the call statement). The scaler is an attribute of the instance,
so `enabled=self.scaler.is_enabled()` holds in every caller. A use of the name otherwise (on
another object, as a value, a call without the loss) refuses: a caller may be out of reach.

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import containing_block, walk
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import Step, Unfixable
from ampmigrate.rules.apex._method_windows import _argument_for
from ampmigrate.rules.apex._regions import NoRegion, Region, autocast_regions


class CallerForward:
    def _caller_regions(self, step: Step) -> Optional[List[Region]]:
        """The regions in the callers of the step's method, or None where the shape is not this
        one (the caller decides what to say); Unfixable where it is and a caller cannot be wrapped."""
        function = step.function
        method = function.node
        if step in getattr(self, "_helper_arguments", {}):
            return self._helper_caller_regions(step)
        if getattr(self.access, "mode", None) != "attribute" or function.parent is None or function.parent.kind != "class":
            return None
        if not isinstance(method, cst.FunctionDef) or not isinstance(step.loss, cst.Name) or method.decorators:
            return None
        params = [p.name.value for p in (*method.params.posonly_params, *method.params.params)]
        if len(params) < 2 or step.loss.value not in params[1:]:
            return None
        if not all(_derived_from_itself(b) for b in self.names.bindings_of(step.loss)):
            return None  # assigned in the method from something else
        name = method.name.value
        position = params.index(step.loss.value) - 1  # among the call's arguments (no `self`)
        classes = self._related_classes(function.parent, name)
        calls = []
        for node in walk(self.module, into_scopes=True):
            if not (isinstance(node, cst.Attribute) and node.attr.value == name):
                continue
            if self._tensor_receiver(node, step):
                continue  # `scaled_loss.backward()` in a method named `backward`: the tensor's own
            call = self.names.parent(node)
            caller = self._function_scope(node)
            if not (
                isinstance(call, cst.Call) and call.func is node and isinstance(node.value, cst.Name)
                and caller.kind == "function" and caller.parent is not None and caller.parent.node in classes
                and _first_param(caller.node) == node.value.value
            ):
                raise Unfixable(
                    f"the loss of `amp.scale_loss` at line {self._line(step.call)} comes from the callers of "
                    f"`{name}()`, and `.{name}` at line {self._line(node)} is not a call `self.{name}(...)` in a "
                    "method of its class: the forward pass there may be out of reach of autocast"
                )
            calls.append((call, caller))
        if not calls:
            return None
        regions: List[Region] = []
        for call, caller in calls:
            argument = _argument(call, position, step.loss.value)
            line = self.names.parent(self.names.parent(call))
            if argument is None or not isinstance(line, cst.SimpleStatementLine) or containing_block(self.names, line) is None:
                raise Unfixable(
                    f"`self.{name}(...)` at line {self._line(call)} is not a statement passing the loss, where the "
                    "forward pass before it could be put under autocast"
                )
            try:
                regions.extend(
                    autocast_regions(
                        self.names, line, argument, self._model_test(caller),
                        self._forward_like_test(caller), self._is_barrier,
                    )
                )
            except NoRegion as exc:
                raise Unfixable(
                    f"no autocast region in `{caller.node.name.value}()` for the loss it passes to `{name}()` at "
                    f"line {self._line(call)}: {exc}"
                )
        self._note(
            f"`amp.scale_loss` is in `{name}()` and the loss comes from its callers: autocast goes around the "
            "forward pass in each (" + ", ".join(dict.fromkeys(f"`{c.node.name.value}()`" for _, c in calls)) + ")"
        )
        return regions

    def _stepping_method_forwards(self, steps: List[Step], planned: List[Region]) -> List[Tuple[Region, Step]]:
        """The forward passes a stepping method runs before calling the methods that scale the loss
        (pix2pix and CycleGAN's `optimize_parameters()`: `self.forward()` computes `self.fake_B`
        from the generator, then `self.backward_D()` scales the discriminator's loss and
        `self.optimizer_D.step()` steps): each statement `self.<m>()` of that method's own block
        before the call (after any earlier step or scaled backward there), `m` a method of the
        class that runs an initialized model and neither steps nor backpropagates, goes under
        autocast too, as apex's O1 ran it in fp16. Only where the scaler is the instance's
        attribute (autocast enabled as `self.scaler` is)."""
        if getattr(self.access, "mode", None) != "attribute":
            return []
        inside = {id(n) for region in planned for statement in region.statements for n in walk(statement)}
        found: List[Tuple[Region, Step]] = []
        for step in steps:
            method = step.function
            if not step.steps or method.parent is None or method.parent.kind != "class":
                continue
            stepping = self._function_scope(step.steps[0])
            if stepping is method or stepping.parent is not method.parent:
                continue
            call_line = self._statement_calling(stepping, method)
            block = containing_block(self.names, call_line) if call_line is not None else None
            if block is None or self.names.parent(block) is not stepping.node:
                continue
            earlier = list(block.body)[: list(block.body).index(call_line)]
            for statement in reversed(earlier):
                if any(isinstance(n, cst.Call) and n in step.steps for n in walk(statement)) or self._is_barrier(statement):
                    break
                forward = self._forward_method_call(statement, stepping)
                if forward is not None and id(statement) not in inside:
                    inside.update(id(n) for n in walk(statement))
                    found.append((Region(block, [statement]), step))
        return found

    def _statement_calling(self, caller: Scope, method: Scope) -> Optional[cst.BaseStatement]:
        """The statement of `caller` that is `self.<method>()`, or `self.<m>()` where `m` of the
        same class calls `self.<method>()` (CycleGAN's `backward_D_A()` around `backward_D_basic()`)."""
        names = {method.node.name.value}
        for scope in self._class_methods(method.parent).values():
            if any(
                isinstance(n, cst.Call) and self._self_method_call(n, scope) is method for n in walk(scope.node)
            ):
                names.add(scope.node.name.value)
        for node in walk(caller.node):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in names:
                target = self._self_method_call(node, caller)
                if target is not None and target.node.name.value in names:
                    line = self.names.statement_of(node)
                    return line if isinstance(line, cst.SimpleStatementLine) else None
        return None

    def _forward_method_call(self, statement: cst.CSTNode, caller: Scope) -> Optional[Scope]:
        """`self.<m>()` alone on its line, `m` a method of the class running an initialized model
        (by the model test of `m` itself) and calling no `backward`/`step`; else None."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)):
            return None
        call = statement.body[0].value
        target = self._self_method_call(call, caller) if isinstance(call, cst.Call) else None
        if target is None:
            return None
        body = target.node.body
        if any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("backward", "step", "zero_grad")
            for n in walk(body)
        ) or any(getattr(r, "node", None) is not None and any(a is target.node for a in self.names.ancestors(r.node)) for r in self.refs):
            return None
        return target if self._model_test(target)(body) else None

    def _tensor_receiver(self, node: cst.Attribute, step: Step) -> bool:
        """`x.<name>` where every binding of `x` is the scaled loss of an `amp.scale_loss` block or
        a parameter some scaled backward of its function takes as its loss: a tensor's method, not
        the trainer's."""
        receiver = node.value
        bindings = self.names.bindings_of(receiver) if isinstance(receiver, cst.Name) else []
        if not bindings:
            return False
        scaled = {id(r.call) for r in self.refs if r.api in ("scale_loss", "handle.scale_loss") and r.call is not None}
        losses = {
            (id(s.function), s.loss.value) for s in getattr(self, "fp16_steps", [step]) if isinstance(s.loss, cst.Name)
        }
        return all(
            (b.kind == "with" and id(b.value) in scaled) or (b.kind == "param" and (id(b.scope), b.name) in losses)
            for b in bindings
        )

    def _single_caller_regions(self, step: Step) -> Optional[List[Region]]:
        """A module-level function that scales the loss it is given, called once in this file by
        the function that steps (`_method_windows._caller_steps`):

            def backward(loss, optimizer):
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()

            def train(...):
                loss = criterion(model(x), y)
                backward(loss, optimizer)
                optimizer.step()

        The forward pass that made the loss is before the call, in the caller: its region is found
        there as in the scaling function itself. None where the shape is not this one."""
        function = step.function
        method = function.node
        start = self._step_starts.get(step)
        if (
            start is None or step in getattr(self, "_helper_arguments", {}) or function.parent is None
            or function.parent.kind != "module" or not isinstance(method, cst.FunctionDef)
            or not isinstance(step.loss, cst.Name)
        ):
            return None
        positional = [p.name.value for p in (*method.params.posonly_params, *method.params.params)]
        if step.loss.value not in positional + [p.name.value for p in method.params.kwonly_params]:
            return None
        if not all(_derived_from_itself(b) for b in self.names.bindings_of(step.loss)):
            return None
        call = self._only_call_of(function)
        if call is None or self.names.statement_of(call) is not start:
            return None
        argument = _argument_for(call, positional, step.loss.value, method=False)
        caller = self._function_scope(call)
        if argument is None or not isinstance(start, cst.SimpleStatementLine) or containing_block(self.names, start) is None:
            raise Unfixable(
                f"the call of `{method.name.value}()` at line {self._line(call)} passes no loss where the forward "
                "pass before it could be put under autocast"
            )
        try:
            regions = autocast_regions(
                self.names, start, argument, self._model_test(caller), self._forward_like_test(caller), self._is_barrier
            )
        except NoRegion as exc:
            raise Unfixable(
                f"no autocast region in `{caller.node.name.value}()` for the loss it passes to `{method.name.value}()` "
                f"at line {self._line(call)}: {exc}"
            )
        self._note(
            f"the forward pass before the call of `{method.name.value}()` goes under autocast in "
            f"`{caller.node.name.value}()`"
        )
        return regions

    def _helper_caller_regions(self, step: Step) -> List[Region]:
        """A module-level backward helper (_helper_calls.py) whose loss is a parameter: at each
        call, the region of what it passes for it, in the calling method."""
        method = step.function.node
        if not isinstance(step.loss, cst.Name) or not all(_derived_from_itself(b) for b in self.names.bindings_of(step.loss)):
            raise Unfixable(f"the loss of `amp.scale_loss` in `{method.name.value}()` is not the one its callers pass")
        regions: List[Region] = []
        callers = []
        for helper_call in self.access.helper_calls[step.function]:
            call = helper_call.call
            argument = helper_call.arguments.get(step.loss.value)
            caller = self._function_scope(call)
            line = self.names.statement_of(call)
            if argument is None or not isinstance(line, cst.SimpleStatementLine) or containing_block(self.names, line) is None:
                raise Unfixable(
                    f"the call at line {self._line(call)} passes no loss where the forward pass before it could be put under autocast"
                )
            try:
                regions.extend(autocast_regions(
                    self.names, line, argument, self._model_test(caller), self._forward_like_test(caller), self._is_barrier
                ))
            except NoRegion as exc:
                raise Unfixable(
                    f"no autocast region in `{caller.node.name.value}()` for the loss it passes to `{method.name.value}()` "
                    f"at line {self._line(call)}: {exc}"
                )
            callers.append(f"`{caller.node.name.value}()`")
        self._note(f"the forward passes before the calls of `{method.name.value}()` go under autocast in {', '.join(dict.fromkeys(callers))}")
        return regions

    def _related_classes(self, cls: Scope, method: str) -> Set[cst.ClassDef]:
        """The class and its subclasses defined at the top of this file that do not define
        `method` again (`self.<method>` there is the class's)."""
        related = {cls.node}
        names = {cls.node.name.value}
        changed = True
        while changed:
            changed = False
            for statement in self.module.body:
                if not isinstance(statement, cst.ClassDef) or statement.name.value in names:
                    continue
                if any(isinstance(b.value, cst.Name) and b.value.value in names for b in statement.bases):
                    if any(isinstance(s, cst.FunctionDef) and s.name.value == method for s in statement.body.body):
                        continue
                    related.add(statement)
                    names.add(statement.name.value)
                    changed = True
        return related


    def _cast_in_region(self, cast: cst.Call) -> bool:
        """A `.half()` inside an autocast region the fix adds, whose value is used only there (an
        argument of a call there, or assigned to a name read only there): the network it feeds
        runs under autocast, which takes float16 inputs to float32 weights as apex O1 did
        (`enc = enc.half()` before `decoder.generate(enc, ...)` in the region of a training step)."""
        for region in getattr(self, "planned_regions", ()):
            inside = {id(n) for statement in region.statements for n in walk(statement)}
            if id(cast) not in inside:
                continue
            node, parent = cast, self.names.parent(cast)
            while (isinstance(parent, cst.Attribute) and parent.value is node) or (isinstance(parent, cst.Call) and parent.func is node):
                node, parent = parent, self.names.parent(parent)  # `x.half().cuda()`
            if isinstance(parent, cst.Arg):
                return True
            if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name)):
                return False
            target = parent.targets[0].target
            for binding in self.names.lookup(target.value, self.names.scope_of(target)):
                if binding.node is target and not all(id(load) in inside for load in self.names.references(binding)):
                    return False
            return True
        return False


def _derived_from_itself(binding) -> bool:
    """The parameter, or a rebinding computed from it (`loss = loss.mean()`, `loss /= n`): the
    forward pass that made the loss stays in the callers."""
    if binding.kind in ("param", "augassign"):
        return True
    if binding.kind != "assign" or binding.value is None:
        return False
    return any(isinstance(n, cst.Name) and n.value == binding.name for n in walk(binding.value))


def _first_param(function: cst.CSTNode) -> Optional[str]:
    if not isinstance(function, cst.FunctionDef):
        return None
    params = [*function.params.posonly_params, *function.params.params]
    return params[0].name.value if params else None


def _argument(call: cst.Call, position: int, keyword: str) -> Optional[cst.BaseExpression]:
    index = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg.value
            continue
        if index == position:
            return arg.value
        index += 1
    return None
