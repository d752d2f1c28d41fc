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
- a plain `x.backward()` (see `_amp_steps._plain_backwards`), which the fix scales while the
  gradients are still scaled; after an `unscale_` the fix puts before it on every path, it adds
  unscaled gradients as in apex and stays as it is (`_amp_steps._rewrite_plain_backwards`).

Code in other files is not seen (an FGM imported from `callback/adversarial.py`, network
slimming's `BNOptimizer.updateBN(model.module_list, s)` adding an L1 term to the BN gradients):
a call the fix cannot read that is handed the model, its modules or parameters, the optimizer, or
an object made from them (`fgm = FGM(model)`) may read or change the gradients, so it is treated
as a reader (`_hands_over_gradients`): `unscale_` before it is exact where it runs once per step,
and the migration is refused where it runs on every micro-step.

A mixin of the planner (`_amp_migration._Planner`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import expression_key, walk
from ampmigrate.engine.names import dotted
from ampmigrate.rules.apex._method_windows import _first_param, _plain_method
from ampmigrate.rules.apex._remote_grad_reads import reads_scaled_gradients, remote_body


class WindowReaders:
    def _reads_scaled_gradients(self, call: cst.Call) -> bool:
        """`call` runs this file's code that reads `.grad` in a way the loss scale changes: it gets
        `scaler.unscale_` before it, where apex had unscaled (`_amp_steps._plan_unscale`)."""
        body = self._own_callee(call)
        if body is None:
            return False
        reads = [n for n in walk(body, into_scopes=True) if self._reads_grad_attribute(n)]
        return bool(reads) and not _scale_invariant(self.names, body, reads)

    def _hands_over_gradients(self, call: cst.Call, step) -> bool:
        """`call` is a statement of its own (run for what it does, not for a value: a value such as
        a regularization loss `reg(model)` is the forward pass's business) that runs code this fix
        cannot read (another file's, a library's) and is given the model, its modules or
        parameters, the optimizer, or an object made from them: it may read or change `.grad`.
        The model's own forward, builtins and logging calls are not counted."""
        if not isinstance(self.names.parent(call), cst.Expr):
            return False
        if self._own_callee(call) is not None:
            return False  # this file's code: `_reads_scaled_gradients` reads it
        func = call.func
        if isinstance(func, cst.Name) and func.value in _GRAD_FREE_FUNCTIONS and not self.names.bindings_of(func):
            return False
        if any(q.startswith("torch_xla.") for q in self.names.qualified_names(func)):
            return False  # a TPU path: apex (CUDA only) never ran beside it
        holders = self._gradient_holders(step)
        if isinstance(func, cst.Attribute):
            if func.attr.value in _GRAD_FREE_METHODS:
                return False
            handed = self._holds_gradients(func.value, holders)
        elif self._holds_gradients(func, holders):
            return False  # `model(x)`: the forward pass reads no gradient
        else:
            handed = False
        if not handed and not any(self._holds_gradients(arg.value, holders) for arg in call.args):
            return False
        body = remote_body(self.ctx.project_index, self._remote_name(call), self.ctx.path)
        return body is None or reads_scaled_gradients(body)

    def _remote_name(self, call: cst.Call) -> str:
        """The qualified name of what `call` runs in another file: `utils.add_sparsity` for a
        function imported by name, `adversarial.FGM.attack` for `fgm.attack()` where `fgm` is only
        ever `FGM(...)` of an imported class; "" otherwise."""
        func = call.func
        qnames = self.names.qualified_names(func)
        if len(qnames) == 1:
            return next(iter(qnames))
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return ""
        inherited = self._inherited_method(call)
        if inherited:
            return inherited
        made = set()
        for binding in self.names.bindings_of(func.value):
            value = binding.value
            if binding.kind != "assign" or not isinstance(value, cst.Call):
                return ""
            made |= self.names.qualified_names(value.func)
        return f"{made.pop()}.{func.attr.value}" if len(made) == 1 else ""

    def _inherited_method(self, call: cst.Call) -> str:
        """`base_model.BaseModel.set_requires_grad` for `self.set_requires_grad(...)` in a method
        of a class of this file that does not define it and has one base, imported (pix2pix's
        models derive from `BaseModel` of `base_model.py`); "" otherwise. The index finds the
        method only where that base defines it itself."""
        func = call.func
        function = self._function_scope(call)
        if not (_plain_method(function) and func.value.value == _first_param(function)):
            return ""
        cls = function.parent.node
        method = func.attr.value
        if not isinstance(cls, cst.ClassDef) or len(cls.bases) != 1 or cls.keywords or method in self._class_methods(function.parent):
            return ""
        if any(
            isinstance(n, cst.Attribute) and n.attr.value == method and isinstance(self.names.parent(n), cst.AssignTarget)
            for n in walk(cls)
        ):
            return ""  # `self.m = ...` somewhere in the class
        base = cls.bases[0].value
        bases = self.names.qualified_names(base)
        if len(bases) == 1:
            return f"{next(iter(bases))}.{method}"
        bindings = self.names.bindings_of(base) if isinstance(base, cst.Name) else []
        if len(bindings) != 1 or bindings[0].kind != "from-import" or not isinstance(bindings[0].statement, cst.ImportFrom):
            return ""
        statement = bindings[0].statement
        index = self.ctx.project_index
        if statement.module is None or index is None:
            return ""
        # `from .base_model import BaseModel`: the index resolves the module from this file's folder,
        # and the file's cache key holds it only where the module's name alone finds the same file
        module = dotted(statement.module)
        found = index.module_for(module, self.ctx.path)
        if found is None or index.module_for(module) != found:
            return ""
        return f"{module}.{bindings[0].node.name.value}.{method}"

    def _gradient_holders(self, step) -> Set[str]:
        """Spellings (`model`, `self.net`, `optimizer`, `fgm`) of what holds the gradients: the
        models `amp.initialize` was given and the names it bound, the step's optimizers, and the
        names of the file bound to values made from them (`params = model.parameters()`,
        `fgm = FGM(model)`), schedulers aside."""
        cache = getattr(self, "_holders_cache", None)
        if cache is not None and cache[0] is step:
            return cache[1]
        holders: Set[str] = set()
        roots = [self.spec.models] if getattr(self, "spec", None) is not None and self.spec.models is not None else []
        roots += list(step.optimizers)
        small = self.init_line.body[0] if getattr(self, "init_line", None) is not None else None
        if isinstance(small, cst.Assign):
            roots += [t.target for t in small.targets]
        for root in roots:
            for node in _elements(root):
                if isinstance(node, (cst.Name, cst.Attribute)):
                    holders.add(expression_key(node))
        assigns = [n for n in self.names.nodes_of_type((cst.Assign,)) if len(n.targets) == 1]
        for _ in range(3):  # names made from names made from the model: a few links are enough
            grown = False
            for assign in assigns:
                target = assign.targets[0].target
                if not isinstance(target, (cst.Name, cst.Attribute)) or expression_key(target) in holders:
                    continue
                if _is_scheduler(self.ctx.code(assign.value)) or not self._made_from(assign.value, holders):
                    continue
                holders.add(expression_key(target))
                grown = True
            if not grown:
                break
        self._holders_cache = (step, holders)
        return holders

    def _made_from(self, value: cst.BaseExpression, holders: Set[str]) -> bool:
        """`value` holds gradients (`model.parameters()`) or is made from something that does
        (`FGM(model)`), not the output of running the model (`model(x)`)."""
        if self._holds_gradients(value, holders):
            return True
        return (
            isinstance(value, cst.Call)
            and _constructs(value.func)
            and any(self._holds_gradients(arg.value, holders) for arg in value.args)
        )

    def _holds_gradients(self, node: cst.BaseExpression, holders: Set[str]) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute)):
            current: cst.BaseExpression = node
            while isinstance(current, cst.Attribute):
                if expression_key(current) in holders:
                    return True
                current = current.value
            return isinstance(current, cst.Name) and expression_key(current) in holders
        if isinstance(node, cst.Subscript):
            return self._holds_gradients(node.value, holders)
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in _PARAMETER_METHODS:
                return self._holds_gradients(func.value, holders)
            if isinstance(func, cst.Name) and func.value in ("list", "tuple", "iter", "filter", "chain"):
                return any(self._holds_gradients(a.value, holders) for a in node.args)
            return False
        if isinstance(node, (cst.List, cst.Tuple)):
            return any(self._holds_gradients(e.value, holders) for e in node.elements)
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
            return self._holds_gradients(node.for_in.iter, holders)
        return False

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
# Calls handed the model or the optimizer that read no gradient (_hands_over_gradients).
_GRAD_FREE_FUNCTIONS = frozenset(
    ("print", "len", "isinstance", "getattr", "hasattr", "setattr", "type", "id", "str", "repr", "format", "vars",
     "list", "tuple", "iter", "sorted", "enumerate", "zip", "sum", "any", "all", "next", "dict", "set", "range")
)
_GRAD_FREE_METHODS = frozenset(
    ("zero_grad", "train", "eval", "state_dict", "to", "cuda", "cpu", "float", "half", "double", "parameters",
     "named_parameters", "modules", "named_modules", "children", "named_children", "get_lr", "get_last_lr",
     "info", "debug", "warning", "warn", "error", "log", "write", "set_postfix", "set_description", "add_scalar",
     "add_scalars", "item", "size", "numel", "requires_grad_", "append", "extend", "format", "join", "step",
     "backward", "load_state_dict", "buffers", "named_buffers", "add_param_group",
     "unscale_", "scale", "update", "get_scale")  # backward: _amp_steps._plain_backwards; a GradScaler's own
)
_PARAMETER_METHODS = frozenset(("parameters", "named_parameters", "modules", "named_modules", "children", "named_children"))


def _elements(node: cst.BaseExpression) -> List[cst.BaseExpression]:
    if isinstance(node, (cst.List, cst.Tuple)):
        return [x for e in node.elements for x in _elements(e.value)]
    return [node]


def _constructs(func: cst.BaseExpression) -> bool:
    """`FGM(...)`, `utils.EMA(...)`: a class by Python's naming convention, whose instance keeps what
    it is given (a lower-case function's value, `reg(model)`, is a value such as a loss)."""
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    return name[:1].isupper()


def _is_scheduler(code: str) -> bool:
    """A learning-rate scheduler made from the optimizer (`get_linear_schedule_with_warmup(opt, ...)`,
    `lr_scheduler.StepLR(opt, ...)`, `build_scheduler(cfg, opt)`): it reads the learning rate, not `.grad`."""
    return "schedul" in code.split("(", 1)[0].lower()


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
