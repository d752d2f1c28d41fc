"""AMP409: a model converted to float16 (`.half()`, `.to(torch.float16)`) and then trained.

Only a conversion that is followed, in the same function (or module body), by training the same
model counts: an optimizer built over `model.parameters()`, or `model.train()`; or a builder of
this file that converts and returns the model (`model.half(); return model`), whose caller
trains what it gets. A `.half()` for
inference, export or a smaller checkpoint (after training, or with no training in sight) is never
reported, nor code that keeps float32 master weights itself (apex `FP16_Optimizer`, DeepSpeed).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.autocasts import DtypeFollower, dtype_name
from ampmigrate.api import MASTER_WEIGHT_WRAPPERS
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._common import is_test_file

# Module methods that return the module itself: `model.cuda().half()` converts `model`.
_CHAINABLE = frozenset({"cuda", "to", "half", "train", "eval", "cpu", "requires_grad_", "float"})
_OPTIMIZER_PACKAGES = (
    "torch.optim.",
    "apex.optimizers.",
    "bitsandbytes.optim.",
    "timm.optim.",
    "transformers.optimization.",
)
_OPTIMIZER_EXCLUDED = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
_PARAMETER_METHODS = ("parameters", "named_parameters")
_HARMLESS_CALLS = frozenset({"print", "len", "isinstance", "id", "type", "repr", "str"})


@dataclass(eq=False)
class _Conversion:
    call: cst.Call  # model.half() / model.to(torch.float16); for a builder's result, the call of the builder
    target: str  # "model" or "self.model": what is converted
    statement: cst.CSTNode
    scope: object
    # `model = build_model(...)` where the builder converts and returns what it builds: the
    # conversion inside it (where the finding is reported, and the fix belongs).
    origin: Optional["_Conversion"] = None


class PureFp16Training(Rule):
    code = "AMP409"
    # A float16 conversion (`torch.float16`, `torch.half`, `.half()`) ...
    triggers = ("float16", r"\bhalf\b")
    # ... as `.half()` or `.to(...)` (the training use may be in another file: see the screen).
    requires = (r"\.\s*(?:half\s*\(\s*\)|to\s*\()",)

    def screen(self, tree: ast.Module) -> bool:
        return _may_train_a_conversion(tree)

    def applies_to(self, path, settings) -> bool:
        return not is_test_file(path)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings) or ctx.names.find(MASTER_WEIGHT_WRAPPERS):
            return  # fp32 master weights are kept by the wrapper
        calls = _calls(ctx)
        conversions = self._conversions(ctx, calls)
        reported: Set[int] = set()
        self._trained_in_other_files(ctx, conversions, reported)
        for conversion in conversions + _builder_results(ctx, conversions, calls):
            origin = conversion.origin or conversion
            if id(origin) in reported:
                continue
            training = self._training_use(ctx, conversion, calls)
            if training is None:
                continue
            reported.add(id(origin))
            what = "`.half()`" if origin.call.func.attr.value == "half" else "`.to(torch.float16)`"
            if conversion.origin is not None:
                function = ctx.names.enclosing(origin.call, cst.FunctionDef)
                what += f" in `{function.name.value}`, which returns it"
                training += f" in `{_owner_name(ctx, conversion.call)}`"
            message = (
                f"`{conversion.target}` is converted to float16 ({what}) and then trained ({training}): the "
                "optimizer updates float16 weights directly, with no float32 master copy, so small updates "
                "round away and large gradients overflow; keep the weights in float32 and train under autocast "
                "(bfloat16, or float16 with a GradScaler)"
            )
            ctx.report(
                origin.call.func.attr,
                message,
                no_fix_reason="the weights must stay float32 and the forward pass move under autocast, which needs a hand",
            )

    def _trained_in_other_files(self, ctx, conversions: List[_Conversion], reported: Set[int]) -> None:
        """A top-level builder of this file that converts what it returns, imported by name and
        its result trained in another file of the run (the project index): pure float16
        training split across files, reported at the conversion, where the change belongs."""
        index = ctx.file.project_index
        if index is None:
            return
        for function, conversion in _returning_builders(ctx, conversions).items():
            if ctx.names.parent(function) is not ctx.module or not _explicit_conversion(conversion.call):
                continue
            trainer = index.result_trained_in(ctx.path, function.name.value)
            if trainer is None:
                continue
            reported.add(id(conversion))
            what = "`.half()`" if conversion.call.func.attr.value == "half" else "`.to(torch.float16)`"
            ctx.report(
                conversion.call.func.attr,
                f"`{conversion.target}` is converted to float16 ({what} in `{function.name.value}`, which returns "
                f"it) and then trained ({index.relative(trainer)} builds it with `{function.name.value}` and trains "
                "it): the optimizer updates float16 weights directly, with no float32 master copy, so small "
                "updates round away and large gradients overflow; keep the weights in float32 and train under "
                "autocast (bfloat16, or float16 with a GradScaler)",
                no_fix_reason="the weights must stay float32 and the forward pass move under autocast, which needs a hand",
            )

    # ------------------------------------------------------------------ conversions
    def _conversions(self, ctx, calls: List[cst.Call]) -> List[_Conversion]:
        found = []
        for call in calls:
            if not self._converts_to_fp16(ctx, call):
                continue
            statement = ctx.names.enclosing(call, cst.BaseSmallStatement)
            target = None
            if isinstance(statement, cst.Expr) and statement.value is call:
                target = _chain_root(ctx, call.func.value)  # model.cuda().half()
            elif isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1:
                target = _target_text(ctx, statement.targets[0].target)  # model = Net().half()
            if target is not None:
                found.append(_Conversion(call, target, statement, ctx.names.scope_of(call)))
        return found

    def _converts_to_fp16(self, ctx, call: cst.Call) -> bool:
        func = call.func
        if not isinstance(func, cst.Attribute):
            return False
        if func.attr.value == "half":
            return not call.args
        if func.attr.value != "to":
            return False
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value != "dtype":
                continue
            followed = DtypeFollower(ctx.file, check_uses=False).follow(arg.value)
            if followed.complete and followed.sources and followed.values() == {"float16"}:
                return True
        return False

    # ------------------------------------------------------------------ training after it
    def _training_use(self, ctx, conversion: _Conversion, calls: List[cst.Call]) -> Optional[str]:
        start = _position(ctx, conversion.call)
        for call in calls:
            if ctx.names.scope_of(call) is not conversion.scope or _position(ctx, call) <= start:
                continue
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "train"
                and _text(ctx, func.value) == conversion.target
                and all(a.value is not None and _is_true(a.value) for a in call.args)
            ):
                return self._unless_changed(
                    ctx, conversion, call, f"`{conversion.target}.train()` at line {_line(ctx, call)}"
                )
            qnames = ctx.names.qualified_names(func)
            if any(q.startswith(_OPTIMIZER_PACKAGES) and not q.startswith(_OPTIMIZER_EXCLUDED) for q in qnames):
                if call.args and _uses_parameters_of(ctx, call.args[0].value, conversion.target):
                    return self._unless_changed(
                        ctx, conversion, call, f"an optimizer over its parameters at line {_line(ctx, call)}"
                    )
        return None

    def _unless_changed(self, ctx, conversion: _Conversion, use: cst.Call, what: str) -> Optional[str]:
        """None when the use does not train what was converted: it sits in another branch of an
        `if`, or between the two the model is rebound, cast back or handed to other code (which
        may wrap it, cast it, or attach float32 adapters to it)."""
        if _exclusive_branches(ctx, conversion.call, use):
            return None
        start, end = _position(ctx, conversion.call), _position(ctx, use)
        between = lambda node: start < _position(ctx, node) < end  # noqa: E731
        root = conversion.target.split(".")[0]
        for name, scope in ctx.names.loads.items():
            if name.value != root or scope is not conversion.scope or not between(name):
                continue
            node = name if root == conversion.target else ctx.names.parent(name)
            if _text(ctx, node) != conversion.target:
                continue
            parent = ctx.names.parent(node)
            if isinstance(parent, cst.Arg):
                call = ctx.names.parent(parent)
                if not (isinstance(call.func, cst.Name) and call.func.value in _HARMLESS_CALLS):
                    return None  # passed to other code
            if isinstance(parent, cst.Attribute) and parent.value is node and _casts_back(ctx, parent):
                return None
        if root == conversion.target:
            for binding in ctx.names.lookup(root, conversion.scope):
                if binding.kind == "param" or not between(binding.node):
                    continue
                if binding.value is None or _chain_root(ctx, binding.value) != root:
                    return None  # rebound to something else (`model = get_peft_model(model, ...)`)
        for store in ctx.names.store_attributes:
            if (
                _text(ctx, store) == conversion.target
                and ctx.names.scope_of(store) is conversion.scope
                and between(store)
            ):
                return None
        return what


def _returning_builders(ctx, conversions: List[_Conversion]) -> dict:
    """FunctionDef -> the conversion whose target every `return` of that function gives back
    (`model.half(); return model`)."""
    returned: dict = {}
    for conversion in conversions:
        function = ctx.names.enclosing(conversion.call, cst.FunctionDef)
        if function is None or "." in conversion.target or function in returned:
            continue
        returns = [
            node
            for node in ctx.names.nodes_of_type(cst.Return)
            if ctx.names.enclosing(node, cst.FunctionDef) is function
        ]
        if returns and all(isinstance(r.value, cst.Name) and r.value.value == conversion.target for r in returns):
            returned[function] = conversion
    return returned


def _builder_results(ctx, conversions: List[_Conversion], calls: List[cst.Call]) -> List[_Conversion]:
    """`model = build_model(...)` in one function where `build_model`, a function of this file,
    converts a name to float16 and returns it (`model.half(); return model`): the conversion
    reaches the caller, which may train it (pure float16 training split across functions)."""
    returned = _returning_builders(ctx, conversions)
    found: List[_Conversion] = []
    if not returned:
        return found
    for call in calls:
        if not isinstance(call.func, cst.Name):
            continue
        bindings = ctx.names.bindings_of(call.func)
        if len(bindings) != 1 or bindings[0].kind != "def" or bindings[0].node not in returned:
            continue
        statement = ctx.names.enclosing(call, cst.BaseSmallStatement)
        if not (isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1):
            continue
        target = _target_text(ctx, statement.targets[0].target)
        if target is not None:
            origin = returned[bindings[0].node]
            found.append(_Conversion(call, target, statement, ctx.names.scope_of(call), origin))
    return found


def _explicit_conversion(call: cst.Call) -> bool:
    """The CST twin of the screen's `_explicit_fp16`: `.half()`, or `.to(torch.float16 | torch.half)`."""
    if call.func.attr.value == "half":
        return True
    return any(isinstance(a.value, cst.Attribute) and a.value.attr.value in ("float16", "half") for a in call.args)


def _owner_name(ctx, node: cst.CSTNode) -> str:
    function = ctx.names.enclosing(node, cst.FunctionDef)
    return function.name.value if function is not None else "the module body"


def _casts_back(ctx, attribute: cst.Attribute) -> bool:
    """`model.float()`, `model.to(torch.float32)`: the float16 conversion is undone."""
    if attribute.attr.value in ("float", "double", "bfloat16"):
        return True
    call = ctx.names.parent(attribute)
    if attribute.attr.value == "to" and isinstance(call, cst.Call):
        return any(dtype_name(ctx.file, a.value) not in (None, "float16") for a in call.args)
    return False


def _exclusive_branches(ctx, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """True when the two sit in different branches of one `if` (or `try`/`except`)."""
    second_ancestors = set(ctx.names.ancestors(second))
    child = first
    for ancestor in ctx.names.ancestors(first):
        if ancestor in second_ancestors:
            if isinstance(ancestor, (cst.If, cst.Try)) and not _same_branch(ctx, ancestor, child, second):
                return True
            return False
        child = ancestor
    return False


def _same_branch(ctx, owner: cst.CSTNode, child: cst.CSTNode, other: cst.CSTNode) -> bool:
    other_child = other
    for ancestor in ctx.names.ancestors(other):
        if ancestor is owner:
            break
        other_child = ancestor
    return other_child is child


def _calls(ctx) -> List[cst.Call]:
    return ctx.names.nodes_of_type(cst.Call)


def _chain_root(ctx, node: cst.BaseExpression) -> Optional[str]:
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _CHAINABLE:
        node = node.func.value
    return _target_text(ctx, node)


def _target_text(ctx, node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return f"self.{node.attr.value}"
    return None


def _text(ctx, node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, (cst.Name, cst.Attribute)):
        return _target_text(ctx, node)
    return None


def _uses_parameters_of(ctx, expression: cst.CSTNode, target: str, depth: int = 0) -> bool:
    """Does the optimizer's parameter argument hold `target.parameters()` (directly, in param
    groups, or through a name assigned them: `params = [{"params": model.parameters()}]`)?"""
    if isinstance(expression, cst.Name) and depth == 0:
        return any(
            b.kind == "assign" and b.value is not None and _uses_parameters_of(ctx, b.value, target, depth + 1)
            for b in ctx.names.bindings_of(expression)
        )
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in _PARAMETER_METHODS:
                if _text(ctx, func.value) == target:
                    found = True

    expression.visit(_Finder())
    return found


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _position(ctx, node: cst.CSTNode) -> Tuple[int, int]:
    start = ctx.position(node).start
    return start.line, start.column


def _line(ctx, node: cst.CSTNode) -> int:
    return ctx.position(node).start.line


# ---------------------------------------------------------------------------------- the `ast` screen
class _Group:
    """What one function body (or the module) could hold, as far as the screen can tell."""

    def __init__(self) -> None:
        self.conversion = False  # a statement that could be a float16 conversion
        self.training = False  # a call that could be a training use
        self.names_passed: Set[str] = set()  # names given to a call (an optimizer given params?)
        self.returns = False  # a `return` with a value: a builder handing a conversion to its caller?
        self.explicit = False  # a conversion spelled `.half()` / `.to(torch.float16)`: another file may train it
        self.top_level = False  # a function of the module body: only such a builder is followed into other files


def _may_train_a_conversion(tree: ast.Module) -> bool:
    """Over-approximates `check` before LibCST parses the file: some function body (or the
    module) holds both a statement that could be a float16 conversion and a call that could be
    a training use (`x.train()`, or a call given `.parameters()` or a name assigned them).
    Class bodies, lambdas and comprehensions count with the body around them, and a
    definition's decorators, defaults and annotations with both bodies, so that each of the
    resolver's scopes falls inside one group here, whatever it decides for those parts."""
    groups = [_Group()]
    parameter_names: Set[str] = set()  # names assigned something holding `.parameters()`
    stack: List[Tuple[ast.AST, Tuple[_Group, ...]]] = [(tree, (groups[0],))]
    top_level = {id(statement) for statement in tree.body}
    while stack:
        node, owners = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = _Group()
            inner.top_level = id(node) in top_level
            groups.append(inner)
            stack.extend((statement, (inner,)) for statement in node.body)
            stack.extend((part, owners + (inner,)) for part in (*node.decorator_list, node.args, node.returns) if part)
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            if _could_convert(node):
                for owner in owners:
                    owner.conversion = True
                    owner.explicit = owner.explicit or _explicit_fp16(node.value)
            if _holds_parameters(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                parameter_names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Expr) and _could_convert(node):
            for owner in owners:
                owner.conversion = True
                owner.explicit = owner.explicit or _explicit_fp16(node.value)
        elif isinstance(node, ast.Return) and node.value is not None:
            for owner in owners:
                owner.returns = True
        elif isinstance(node, ast.Call):
            _note_call(node, owners)
            if any(owner.conversion and owner.training for owner in owners):
                return True
        stack.extend((child, owners) for child in ast.iter_child_nodes(node))
    trains = [g.training or bool(g.names_passed & parameter_names) for g in groups]
    if any(g.conversion and t for g, t in zip(groups, trains)):
        return True
    # A builder that converts and returns, trained by another function of the file, or (an
    # explicit conversion in a function of the module body: `_trained_in_other_files`) by
    # another file of the run.
    return any(g.conversion and g.returns and ((g.explicit and g.top_level) or any(trains)) for g in groups)


def _explicit_fp16(call: ast.AST) -> bool:
    """`x.half()`, or `x.to(...)` given `torch.float16` / `torch.half` itself (not a variable)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    if call.func.attr == "half":
        return True
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(v, ast.Attribute) and v.attr in ("float16", "half") for v in values)


def _could_convert(statement) -> bool:
    """`model.half()` / `model = Net().to(dtype)` as a whole statement (see `_conversions`)."""
    if isinstance(statement, ast.Assign) and len(statement.targets) != 1:
        return False
    if isinstance(statement, ast.AnnAssign):
        return False  # the resolver's conversions are `x.half()` and `x = ...` statements only
    call = statement.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    if call.func.attr == "half":
        return not call.args and not call.keywords
    return call.func.attr == "to" and (bool(call.args) or any(k.arg in (None, "dtype") for k in call.keywords))


def _note_call(call: ast.Call, owners: Tuple[_Group, ...]) -> None:
    """`x.train(...)`, or a call (an optimizer?) given something's `.parameters()` or a name."""
    func = call.func
    training = isinstance(func, ast.Attribute) and func.attr == "train"
    if not training and isinstance(func, (ast.Name, ast.Attribute)):
        for value in (*call.args, *(k.value for k in call.keywords)):
            if isinstance(value, ast.Starred):
                value = value.value
            if isinstance(value, ast.Name):
                for owner in owners:
                    owner.names_passed.add(value.id)
            elif _holds_parameters(value):
                training = True
    if training:
        for owner in owners:
            owner.training = True


def _holds_parameters(value: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _PARAMETER_METHODS
        for node in ast.walk(value)
    )

