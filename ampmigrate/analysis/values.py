"""Following a value to the places it is written.

A rule that changes a setting (an autocast dtype, a framework's precision flag) must edit the
place the value comes from, not the place it is used: `dtype=amp_dtype` is fixed at
`amp_dtype = torch.float16`, `mixed_precision=args.mixed_precision` at the default of the
`--mixed_precision` option. `Follower.follow(expr)` walks from an expression through ternaries,
names assigned in a visible scope, `self.<attr>` assignments and argparse options to the
*sources* of its value. Anything else (a parameter, a call, an environment variable) could be
any value at run time: the result is then incomplete, and rules stay silent about it.

A source is only safe to edit when the variable it flows through is used for nothing but
settings like the one being changed; `allowed_use` says which uses those are, and the result's
`blocker` names the first other use.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.engine.context import FileContext
from ampmigrate.engine.cst_walk import walk
from ampmigrate.engine.names import Binding

UNKNOWN: Any = object()  # a leaf that is not a value this follower knows
_MAX_DEPTH = 8


@dataclass(eq=False)
class Source:
    """One place the followed value is written."""

    node: Optional[cst.BaseExpression]  # the written value; None for an implicit default
    value: Any  # its meaning: a Python literal, or what the follower's leaf made of it
    via: str = ""  # how it reaches the use: "", "`amp_dtype`", "option `--dtype`"
    choices: Optional[Tuple[Any, ...]] = None  # the argparse option's `choices`, when it is one
    option: Optional["ArgparseOption"] = None  # the argparse option whose default this is
    # Set by followers that map values (a dict lookup): the value the source must take instead
    # to give bfloat16, or why there is none.
    bf16: Any = None
    no_bf16: Optional[str] = None


@dataclass
class Followed:
    sources: List[Source] = field(default_factory=list)
    complete: bool = True  # every path ended in a known value
    blocker: Optional[str] = None  # why editing the sources would change more than this use

    def values(self) -> Set[Any]:
        return {s.value for s in self.sources}


def literal_value(node: cst.CSTNode) -> Any:
    """The Python value of a literal (`"fp16"`, `16`, `True`, `None`), else UNKNOWN."""
    if isinstance(node, cst.SimpleString):
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, SyntaxError):
            return UNKNOWN
        return value if isinstance(value, str) else UNKNOWN
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return ast.literal_eval(node.value)
        except (ValueError, SyntaxError):
            return UNKNOWN
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    return UNKNOWN


def respell_string(node: cst.SimpleString, value: str) -> cst.SimpleString:
    """A string literal with a new (plain) value in the old one's prefix and quotes."""
    prefix_length = len(node.prefix)
    quote = node.quote
    return node.with_changes(value=f"{node.value[:prefix_length]}{quote}{value}{quote}")


def snippet(ctx: FileContext, node: cst.CSTNode) -> str:
    """The first line of the statement holding `node`, without its comments, for messages."""
    statement: cst.CSTNode = node
    for ancestor in ctx.names.ancestors(node):
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            statement = ancestor
            break
    if isinstance(statement, cst.BaseCompoundStatement):
        statement = getattr(statement, "test", None) or getattr(statement, "iter", None) or statement
    lines = ctx.code(statement).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= 80 else text[:77] + "..."


def is_reporting_use(ctx: FileContext, ref: cst.CSTNode) -> bool:
    """`print(x)`, `f"{x}"`, `logger.info(..., x)`: uses that only show the value."""
    for ancestor in ctx.names.ancestors(ref):
        if isinstance(ancestor, cst.FormattedStringExpression):
            return True
        if isinstance(ancestor, cst.Call):
            func = ancestor.func
            name = (
                func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
            )
            return name in ("print", "info", "debug", "warning", "log", "write")
        if isinstance(ancestor, (cst.BaseStatement, cst.Lambda)):
            return False
    return False


def is_comparison_use(ctx: FileContext, ref: cst.CSTNode) -> bool:
    """`x == "fp16"`, `x is torch.float16`, `x in (...)`: the code branches on the setting,
    so it follows a new value consistently."""
    parent = ctx.names.parent(ref)
    return isinstance(parent, (cst.Comparison, cst.ComparisonTarget))


class Follower:
    """Follows expressions to their sources; subclasses teach it more kinds of leaves."""

    def __init__(
        self,
        ctx: FileContext,
        allowed_use: Optional[Callable[[cst.CSTNode], bool]] = None,
        check_uses: bool = True,
    ) -> None:
        self.ctx = ctx
        self.names = ctx.names
        self.allowed_use = allowed_use or (lambda ref: False)
        self.check_uses = check_uses  # False: only the values matter, no edit will follow

    # ------------------------------------------------------------------ entry point
    def follow(self, expr: cst.BaseExpression) -> Followed:
        out = Followed()
        self._origin = expr
        self._walk(expr, "", 0, out, set())
        return out

    # ------------------------------------------------------------------ what subclasses extend
    def leaf(self, expr: cst.BaseExpression) -> Any:
        """The value a leaf expression stands for, or UNKNOWN to keep following it."""
        return literal_value(expr)

    def special(self, expr: cst.BaseExpression, via: str, depth: int, out: Followed, seen: Set[int]) -> bool:
        """Handle an expression kind the base follower does not know; True when handled."""
        return False

    # ------------------------------------------------------------------ the walk
    def _walk(self, expr, via: str, depth: int, out: Followed, seen: Set[int]) -> None:
        if depth > _MAX_DEPTH or id(expr) in seen:
            out.complete = False
            return
        seen = seen | {id(expr)}
        value = self.leaf(expr)
        if value is not UNKNOWN:
            out.sources.append(Source(expr, value, via))
            return
        if isinstance(expr, cst.IfExp):
            self._walk(expr.body, via, depth + 1, out, seen)
            self._walk(expr.orelse, via, depth + 1, out, seen)
            return
        if self.special(expr, via, depth, out, seen):
            return
        if isinstance(expr, cst.Name):
            bindings = self.names.bindings_of(expr)
            if len(bindings) == 1 and bindings[0].kind == "param":
                self._through_parameter_default(bindings[0], depth, out, seen)
                return
            self._through_bindings(bindings, f"`{expr.value}`", self.names.references, depth, out, seen)
            return
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
            bindings = self.names.self_attribute_bindings(expr)
            if bindings:
                via = f"`self.{expr.attr.value}`"
                self._through_bindings(bindings, via, self._attribute_references, depth, out, seen)
                return
            option = argparse_option(self.ctx, expr)
            if option is not None:
                self._through_option(option, depth, out, seen)
                return
            field_binding = dataclass_field(self.ctx, expr)
            if field_binding is not None:
                via = f"field `{field_binding.name}`"
                self._through_bindings([field_binding], via, lambda b: [], depth, out, seen)
                return
        out.complete = False

    def _through_bindings(self, bindings: List[Binding], via: str, references, depth, out, seen) -> None:
        if not bindings:
            out.complete = False
            return
        for binding in bindings:
            if binding.kind not in ("assign", "annotation") or binding.value is None:
                out.complete = False
                continue
            if self.check_uses:
                self._check_uses(binding, via, references(binding), out)
            self._walk(binding.value, via, depth + 1, out, seen)

    def _through_parameter_default(self, binding: Binding, depth, out: Followed, seen) -> None:
        """A parameter's default is where its value is written when no call of this file passes
        it (`def train(..., amp_dtype=torch.float16)`); a call that passes it could pass anything."""
        param = self.names.parent(binding.node)
        function = binding.scope.node
        if not isinstance(param, cst.Param) or param.default is None or not isinstance(function, cst.FunctionDef):
            out.complete = False
            return
        if param.star or param not in (*function.params.params, *function.params.kwonly_params, *function.params.posonly_params):
            out.complete = False
            return
        if _passed_by_some_call(self.ctx, function, param) or _called_elsewhere(self.ctx, function):
            out.complete = False
            return
        via = f"the default of parameter `{binding.name}`"
        if self.check_uses:
            self._check_uses(binding, via, self.names.references(binding), out)
        self._walk(param.default, via, depth + 1, out, seen)

    def _check_uses(self, binding: Binding, via: str, refs, out: Followed) -> None:
        if out.blocker is not None:
            return
        for ref in refs:
            if ref is self._origin or self.allowed_use(ref) or is_reporting_use(self.ctx, ref):
                continue
            line = self.ctx.position(ref).start.line
            out.blocker = (
                f"{via} is also used at line {line} (`{snippet(self.ctx, ref)}`), which the change would affect too"
            )
            return

    def _attribute_references(self, binding: Binding) -> List[cst.Attribute]:
        """Every `self.<attr>` load in the class of `binding` (a `self.<attr> = ...` assignment)."""
        wanted = binding.name
        found = []
        for node in self.names.name_attributes:
            if node.attr.value != wanted or node in self.names.store_attributes:
                continue
            if binding in self.names.self_attribute_bindings(node):
                found.append(node)
        return found

    def _through_option(self, option: "ArgparseOption", depth, out, seen) -> None:
        via = f"option `{option.flag}`"
        before = len(out.sources)
        if option.default is None:
            out.sources.append(Source(None, option.implicit_default, via))
        else:
            self._walk(option.default, via, depth + 1, out, seen)
        for source in out.sources[before:]:  # (also a default written through a constant)
            source.choices = option.choices
            source.option = option


# ---------------------------------------------------------------------------------- argparse
@dataclass(eq=False)
class ArgparseOption:
    call: cst.Call  # parser.add_argument(...)
    flag: str  # "--dtype"
    dest: str
    default: Optional[cst.BaseExpression]  # the `default=` expression, if any
    implicit_default: Any  # what argparse uses without one
    choices: Optional[Tuple[Any, ...]]  # literal `choices=`, if given as one
    type: Optional[cst.BaseExpression]  # the `type=` converter, if any

    def accepts(self, value: Any) -> Optional[str]:
        """Why `value` cannot be this option's default (None when it can)."""
        if self.choices is not None and value not in self.choices:
            return f"option `{self.flag}` does not accept {value!r} (its choices are {list(self.choices)})"
        if (
            isinstance(value, str)
            and self.type is not None
            and not (isinstance(self.type, cst.Name) and self.type.value == "str")
        ):
            return f"option `{self.flag}` converts its value with a `type=` that may not take {value!r}"
        return None


def argparse_options(ctx: FileContext) -> Dict[str, List[ArgparseOption]]:
    """Every `<parser>.add_argument(...)` of the file, by destination name."""
    return ctx.shared("argparse.options", lambda: _collect_options(ctx))


def _collect_options(ctx: FileContext) -> Dict[str, List[ArgparseOption]]:
    options: Dict[str, List[ArgparseOption]] = {}
    for node in ctx.names.nodes_of_type(cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            option = _option(node)
            if option is not None:
                options.setdefault(option.dest, []).append(option)
    return options


def _option(call: cst.Call) -> Optional[ArgparseOption]:
    flags = [literal_value(a.value) for a in call.args if a.keyword is None and not a.star]
    if not flags or not all(isinstance(f, str) for f in flags):
        return None
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    long = [f for f in flags if f.startswith("--")]
    flag = long[0] if long else flags[0]
    dest = flag.lstrip("-").replace("-", "_")
    if "dest" in keywords:
        dest = literal_value(keywords["dest"])
        if not isinstance(dest, str):
            return None
    action = literal_value(keywords["action"]) if "action" in keywords else None
    implicit = {"store_true": False, "store_false": True}.get(action) if isinstance(action, str) else None
    choices = None
    if "choices" in keywords and isinstance(keywords["choices"], (cst.List, cst.Tuple, cst.Set)):
        values = tuple(literal_value(e.value) for e in keywords["choices"].elements if isinstance(e, cst.Element))
        if all(v is not UNKNOWN for v in values):
            choices = values
    return ArgparseOption(call, flag, dest, keywords.get("default"), implicit, choices, keywords.get("type"))


_PARSE_METHODS = ("parse_args", "parse_known_args")


def _is_parse_result(ctx: FileContext, value: cst.BaseExpression, depth: int = 0) -> bool:
    """`parser.parse_args()`, `parser.parse_known_args()[0]`, or a call of a function of this file
    that returns one (`args = parse_args()`)."""
    if isinstance(value, cst.Subscript):  # parser.parse_known_args()[0]
        value = value.value
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute) and value.func.attr.value in _PARSE_METHODS:
        return True
    if isinstance(value.func, cst.Name) and depth < 2:
        defs = [b.node for b in ctx.names.bindings_of(value.func) if b.kind == "def"]
        return len(defs) == 1 and _returns_parse_result(ctx, defs[0], depth + 1)
    return False


def _returns_parse_result(ctx: FileContext, function: cst.FunctionDef, depth: int) -> bool:
    found = False

    class _Returns(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function  # not into nested functions

        def visit_Return(self, node: cst.Return) -> None:
            nonlocal found
            value = node.value
            if value is None:
                return
            if isinstance(value, cst.Name):
                bindings = ctx.names.bindings_of(value)
                found = found or any(
                    b.kind == "assign" and b.value is not None and _is_parse_result(ctx, b.value, depth)
                    for b in bindings
                )
            else:
                found = found or _is_parse_result(ctx, value, depth)

    walk(function, _Returns())
    return found


def argparse_option(ctx: FileContext, attr: cst.Attribute) -> Optional[ArgparseOption]:
    """The option `args.<dest>` reads, when `args` holds parsed arguments (or is a parameter)
    and exactly one option of the file has that destination and nothing assigns to it."""
    base = attr.value
    if not isinstance(base, cst.Name):
        return None
    bindings = ctx.names.bindings_of(base)
    if not bindings:
        return None
    for binding in bindings:
        parsed = binding.kind == "assign" and binding.value is not None and _is_parse_result(ctx, binding.value)
        unpacked = (
            binding.kind == "assign"
            and binding.value is None
            and isinstance(binding.statement, cst.Assign)
            and _is_parse_result(ctx, binding.statement.value)
        )
        if not (parsed or unpacked or binding.kind == "param"):
            return None
    candidates = argparse_options(ctx).get(attr.attr.value, [])
    if len(candidates) != 1:
        return None
    for store in ctx.names.store_attributes:
        if (
            store.attr.value == attr.attr.value
            and isinstance(store.value, cst.Name)
            and store.value.value == base.value
        ):
            return None  # args.dtype = ... somewhere: not only the option's value
    return candidates[0]


# ---------------------------------------------------------------------------------- data classes
def dataclass_field(ctx: FileContext, attr: cst.Attribute) -> Optional[Binding]:
    """For `cfg.amp_dtype` where `cfg` is (annotated as, or made from) a `@dataclass` of this
    file: the class-body binding of the field (`amp_dtype: torch.dtype = torch.float16`)."""
    if not isinstance(attr.value, cst.Name):
        return None
    classes: Set[cst.ClassDef] = set()
    for binding in ctx.names.bindings_of(attr.value):
        if binding.kind == "param" and binding.annotation is not None:
            target = binding.annotation
        elif binding.kind == "assign" and isinstance(binding.value, cst.Call):
            target = binding.value.func
        else:
            return None
        found = _local_class(ctx, target)
        if found is None:
            return None
        classes.add(found)
    if len(classes) != 1:
        return None
    (class_def,) = classes
    if not any(_is_dataclass_decorator(ctx, d.decorator) for d in class_def.decorators):
        return None
    scope = ctx.names.scope_entries.get(class_def.body)
    fields = scope.bindings.get(attr.attr.value, []) if scope is not None else []
    if len(fields) != 1 or fields[0].kind not in ("annotation", "assign") or fields[0].value is None:
        return None
    if isinstance(fields[0].value, cst.Call):  # `field(default=...)`, a factory: not followed
        return None
    return fields[0]


def _local_class(ctx: FileContext, expr: cst.BaseExpression) -> Optional[cst.ClassDef]:
    if isinstance(expr, cst.Annotation):
        expr = expr.annotation
    if not isinstance(expr, cst.Name):
        return None
    bindings = ctx.names.bindings_of(expr)
    if len(bindings) == 1 and bindings[0].kind == "class":
        return bindings[0].node
    return None


def _is_dataclass_decorator(ctx: FileContext, decorator: cst.BaseExpression) -> bool:
    if isinstance(decorator, cst.Call):
        decorator = decorator.func
    return "dataclasses.dataclass" in ctx.names.qualified_names(decorator)


def _callable_name(ctx: FileContext, function: cst.FunctionDef) -> str:
    """How calls spell `function`: its name, or its class's for `__init__`."""
    if function.name.value == "__init__":
        owner = ctx.names.enclosing(function, (cst.ClassDef, cst.FunctionDef))
        if isinstance(owner, cst.ClassDef):
            return owner.name.value
    return function.name.value


def _called_elsewhere(ctx: FileContext, function: cst.FunctionDef) -> bool:
    """Another file of the run imports the function (or the class of a method) by name: its
    calls there may pass anything. (Without a project index, as for one text checked through
    the API, other files are not known.)"""
    owner = ctx.names.enclosing(function, (cst.ClassDef, cst.FunctionDef))
    name = owner.name.value if isinstance(owner, cst.ClassDef) else function.name.value
    index = ctx.project_index
    if index is None:
        return False
    return name in index.imported_from(ctx.path) or name in ctx.imported_elsewhere


def _used_as_value(ctx: FileContext, function: cst.FunctionDef) -> bool:
    """The function's name is used other than called directly (`name(...)`)."""
    scope = ctx.names.scope_of(function)
    for binding in scope.bindings.get(function.name.value, []):
        if binding.kind != "def" or binding.node is not function:
            continue
        for ref in ctx.names.references(binding):
            parent = ctx.names.parent(ref)
            if not (isinstance(parent, cst.Call) and parent.func is ref):
                return True
    return False


def _passed_by_some_call(ctx: FileContext, function: cst.FunctionDef, param: cst.Param) -> bool:
    """Whether a call in this file may pass `param` of `function`: any call by the function's
    name (or as a method) that has a `*`/`**` argument, the keyword, or enough positions."""
    name = _callable_name(ctx, function)
    if _used_as_value(ctx, function):
        return True  # `partial(train, dtype=...)`, `Fire(main)`, a callback: called with anything
    params = function.params
    positional = [*params.posonly_params, *params.params]
    position = positional.index(param) if param in positional else None
    for call in ctx.names.nodes_of_type(cst.Call):
        func = call.func
        called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        if called != name:
            continue
        if any(a.star for a in call.args) or any(a.keyword is not None and a.keyword.value == param.name.value for a in call.args):
            return True
        if position is not None:
            count = sum(1 for a in call.args if a.keyword is None)
            bound = isinstance(func, cst.Attribute) or function.name.value == "__init__"
            offset = 1 if bound and positional and positional[0].name.value in ("self", "cls") else 0
            if count + offset > position:
                return True
    return False
