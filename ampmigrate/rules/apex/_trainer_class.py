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

from typing import List, Optional, Set

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.engine.context import rebuild_args
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, _Planner
from ampmigrate.rules.apex._checkpoint_threading import _HelperAccess
from ampmigrate.rules.apex._method_windows import _first_statement, _is_docstring
from ampmigrate.rules.apex._scaler_access import ScalerAccess, add_parameter


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
        return _model_attributes(function.parent)

    def autocast_enabled(self, at: cst.CSTNode) -> str:
        return f"{self.expression(at)}.is_enabled()"  # the caller's opt level, carried by the scaler


# ---------------------------------------------------------------------------------- in one file
def constructed_access(planner: _Planner, use_scopes: List[Scope]) -> Optional[ScalerAccess]:
    """The scaler for a trainer class of the planner's own file that the function calling
    `amp.initialize` constructs (every construction of it there, after `initialize`): created at
    home as today, passed to each construction as `scaler=scaler`, stored as `self.scaler`. None
    when the uses are not all in such a class's methods (the other shapes' access decides)."""
    home = planner.home
    others = [s for s in dict.fromkeys(use_scopes) if s is not home]
    if not others or home.kind != "function" or home.parent is not planner.names.module_scope:
        return None
    classes = {id(s.parent): s.parent for s in others if s.kind == "function" and s.parent is not None}
    if len(classes) != 1:
        return None
    (cls,) = classes.values()
    if cls.kind != "class" or cls.parent is not planner.names.module_scope:
        return None
    name = cls.node.name.value
    bindings = cls.parent.bindings.get(name, [])
    if len(bindings) != 1 or bindings[0].node is not cls.node:
        return None
    refs = planner.names.references(bindings[0])
    init_line = planner._line(planner.init_line)
    constructions: List[cst.Call] = []
    stray = ""
    for ref in refs:
        call = planner.names.parent(ref)
        if _names_own_super(planner, ref, cls):
            continue
        if not (isinstance(call, cst.Call) and call.func is ref):
            stray = stray or f"`{name}` is used at line {planner._line(ref)} otherwise than constructed (a subclass, a value)"
        elif planner._function_scope(call) is not home or planner._line(call) <= init_line:
            stray = stray or f"`{name}` is constructed at line {planner._line(call)}, not after `amp.initialize` in `{home.node.name.value}()`"
        else:
            constructions.append(call)
    if not constructions:
        return None  # not this shape: the other shapes' reasons stand
    if stray:
        raise Unfixable(
            f"`amp.scale_loss` is in `{name}`, which `{home.node.name.value}()` constructs after `amp.initialize`, but "
            f"{stray}: every construction must take the GradScaler created there"
        )
    problem = _class_problem(planner, cls)
    if problem:
        raise Unfixable(f"`amp.scale_loss` is in `{name}`, which `{home.node.name.value}()` constructs after `amp.initialize`, "
                        f"but the GradScaler cannot be passed to it: {problem}")
    if planner.ctx.reexported(bindings[0]):
        raise Unfixable(f"`{name}` is imported by other files, whose constructions would not pass the GradScaler")
    for call in constructions:
        if any(a.star for a in call.args):
            raise Unfixable(f"the construction of `{name}` at line {planner._line(call)} unpacks arguments")
    return ConstructedAccess(planner, use_scopes, cls, constructions)


def _names_own_super(planner: _Planner, ref: cst.CSTNode, cls: Scope) -> bool:
    """`super(Trainer, self)` in one of `Trainer`'s own methods: the class names itself for the
    old-style `super()`, no construction and no escape."""
    call = planner.names.parent(planner.names.parent(ref))
    return (
        isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "super"
        and len(call.args) == 2 and call.args[0].value is ref and call.args[0].keyword is None
        and planner._function_scope(call).parent is cls
    )


def _class_problem(planner: _Planner, cls: Scope) -> str:
    node = cls.node
    name = node.name.value
    if node.decorators or node.keywords or any(b.star or not isinstance(b.value, (cst.Name, cst.Attribute)) for b in node.bases):
        return f"`{name}` has a metaclass, decorators or computed base classes, so its construction cannot be followed"
    init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    if init is None or init.decorators or not init.params.params or not isinstance(init.body, cst.IndentedBlock):
        return f"`{name}` has no plain `__init__` of its own to take the scaler"
    if init.params.posonly_params:
        return f"`{name}.__init__` takes positional-only parameters"
    for statement in node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value in ("__new__", "__setattr__", "__getattribute__"):
            return f"`{name}` defines `{statement.name.value}`"
        if isinstance(statement, cst.SimpleStatementLine) and "__slots__" in planner.ctx.code(statement):
            return f"`{name}` declares `__slots__`"
    return ""


class ConstructedAccess(ScalerAccess):
    """A local scaler at home, `self.<name>` in the trainer class's methods."""

    def __init__(self, planner: _Planner, use_scopes: List[Scope], cls: Scope, constructions: List[cst.Call]) -> None:
        self.p = planner
        self.names = planner.names
        self.home = planner.home
        self.mode = "local"
        self.threaded: List[Scope] = []
        self.hoist_before = None
        self.detached_init = None
        self.cls = cls
        self.constructions = constructions
        taken = set(cls.self_attrs) | set(cls.bindings)
        if cls.node.bases:  # a base class's attributes are unknown here: no name the file uses as one
            taken |= {n.attr.value for n in walk(planner.module) if isinstance(n, cst.Attribute)}
        self.name = next((n for n in (self._choose_name(use_scopes),) if n not in taken), "")
        if not self.name:
            raise Unfixable(f"the scaler's name is taken on `{cls.node.name.value}`")
        self.default_init = None
        self.in_place = False
        self._plan_enabled(use_scopes)  # every `if` around `initialize`: the methods run apart from them
        self.model_names = self._models()

    def _in_class(self, node: cst.CSTNode) -> bool:
        return self.p._function_scope(node).parent is self.cls

    def expression(self, node: cst.CSTNode) -> str:
        if self._in_class(node):
            return f"{self._self_name(node)}.{self.name}"
        return self.name

    def autocast_enabled(self, at: cst.CSTNode):
        if self._in_class(at):
            return f"{self.expression(at)}.is_enabled()" if self.conditions else None
        return super().autocast_enabled(at)

    def model_keys(self, function: Scope, depth: int = 0) -> Set[str]:
        if function.parent is self.cls:
            return _model_attributes(self.cls)
        return super().model_keys(function, depth)

    def emit(self) -> None:
        super().emit()
        builder = self.p.builder
        for call in self.constructions:
            arg = cst.Arg(
                cst.Name(self.name),
                keyword=cst.Name(self.name),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            )
            builder.replace(call, rebuild_args(call, [*call.args, arg]))
            self.p.handled.add(call)
        init = next(s for s in self.cls.node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__")
        builder.replace(init.params, add_parameter(init.params, self.name))
        statement = self.p.ctx.parse_statement(f"{init.params.params[0].name.value}.{self.name} = {self.name}\n")
        body = list(init.body.body)
        if len(body) == 1 and _is_docstring(body[0]):
            builder.insert_after(body[0], statement)
        else:
            builder.insert_before(_first_statement(init), statement)
        self.p._note(
            f"the scaler is passed to `{self.cls.node.name.value}(...)` as a new `{self.name}` argument, kept as "
            f"`self.{self.name}`"
        )


def _model_attributes(cls: Scope) -> Set[str]:
    keys: Set[str] = set()
    for node in walk(cls.node):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            attr = node.attr.value
            if "model" in attr.lower() or "net" in attr.lower():
                keys.add(f"self.{attr}")
    return keys
