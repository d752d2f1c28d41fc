"""timm's loss scaler and autocast variable handed to code in another file of the repository.

The timm-derived scripts of rules/apex/_timm_scaler.py keep their helpers beside them: a copy of
timm's `CheckpointSaver` (`checkpoint_saver.py`, given `amp_scaler=loss_scaler`), a DeiT-style
`train_one_epoch` in `engine.py` (given `loss_scaler` and `amp_autocast`). The project index
(engine/project_index.py) says which file `from engine import train_one_epoch` loads; that file,
as the index read it (engine/caller_uses.py `source_tree`), is read with `ast` here, and what the
named parameter becomes there decides:

- the loss scaler may be tested (`is None`, truth), asked for its state (`state_dict()`,
  `load_state_dict(...)`, `state_dict_key`: ApexScaler's and NativeScaler's answers differ only
  in the key, which the checkpoint note says), or called with timm's protocol
  (`loss_scaler(loss, optimizer, clip_grad=..., parameters=..., create_graph=...)`, the clip
  judged as in the script's own file); stored as `self.<attr>` in a class's `__init__`, every
  use of that attribute in the class's methods must be one of these;
- the autocast variable may only be entered, `with amp_autocast():`.

Anything else (passed on again, assigned, another use) stops the plan with the file and line.
`star_binds` answers the other question only the index can: whether `from models.x import *`
of a file of the repository binds `functools` or `partial`.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.api import TIMM_MODEL_PARAMETERS
from ampmigrate.engine.caller_uses import dotted, source_tree
from ampmigrate.engine.import_resolution import candidates
from ampmigrate.rules.apex._amp_common import Unfixable

_STATE = ("state_dict", "load_state_dict", "state_dict_key")
_SCALER_KEYWORDS = ("loss", "optimizer", "clip_grad", "clip_mode", "parameters", "create_graph", "need_update")
_SAME_POSITIONS = 3
_HALF = ("half", "float16", "HalfTensor")


@dataclass
class RemoteCall:
    """A call of the loss scaler in another file: the functions around it (keys), and what its
    clip means (an unsafe reason or a note, or neither)."""

    functions: List[Tuple[str, str]]
    where: str
    unsafe: Optional[str] = None
    note: Optional[str] = None


@dataclass
class RemoteWith:
    """`with amp_autocast(...):` in another file: the function it is in (key), and its keywords."""

    function: Tuple[str, str]
    where: str
    keywords: List[str] = field(default_factory=list)


@dataclass
class RemoteScaler:
    calls: List[RemoteCall] = field(default_factory=list)
    checkpoints: bool = False


class RemoteCallee:
    """A function or class of another file of the repository that a call of the planner's file
    resolves to, per the project index."""

    def __init__(self, planner, call: cst.Call, path: str, node: ast.AST, tree: ast.Module) -> None:
        self.p = planner
        self.call = call
        self.path = path
        self.node = node
        self.tree = tree
        self.index = planner.ctx.project_index
        self.relative = self.index.relative(path)
        self.spelled = planner.ctx.code(call.func).strip()
        self.parents: Dict[int, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[id(child)] = parent

    # ------------------------------------------------------------------ entry points
    def scaler_uses(self, arg: cst.Arg) -> RemoteScaler:
        function, param = self._parameter(arg, "the loss scaler")
        found = RemoteScaler()
        for node in self._loads(function, param, "the loss scaler"):
            self._scaler_use(node, function, found, "the loss scaler")
        return found

    def autocast_uses(self, arg: cst.Arg, what: str) -> List[RemoteWith]:
        function, param = self._parameter(arg, what)
        withs: List[RemoteWith] = []
        for node in self._loads(function, param, what):
            parent = self.parents.get(id(node))
            item = self.parents.get(id(parent))
            if (
                isinstance(parent, ast.Call)
                and parent.func is node
                and isinstance(item, ast.withitem)
                and item.context_expr is parent
                and not parent.args
                and all(k.arg is not None for k in parent.keywords)
            ):
                keys = self._key(node)
                if keys:
                    withs.append(RemoteWith(keys[-1], self._where(node), [k.arg for k in parent.keywords]))
                    continue
            raise Unfixable(f"{what} is used at {self._where(node)} other than as `with {param}():`")
        return withs

    def half_casts(self) -> Optional[str]:
        """Where the file casts to half (`.half()`, a float16 dtype), if it does."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and node.attr in _HALF:
                return self._where(node)
        return None

    # ------------------------------------------------------------------ the parameter
    def _parameter(self, arg: cst.Arg, what: str) -> Tuple[ast.FunctionDef, str]:
        unseen = f"{what} is passed at line {self.p.ctx.position(self.call).start.line} to `{self.spelled}` ({self.relative})"
        node = self.node
        skip = 0
        if isinstance(node, ast.ClassDef):
            if any(not (isinstance(b, ast.Name) and b.id == "object") for b in node.bases) or node.keywords:
                raise Unfixable(f"{unseen}, a class with base classes this fix does not follow")
            inits = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"]
            if len(inits) != 1 or any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__init__" for t in n.targets) for n in node.body):
                raise Unfixable(f"{unseen}, a class whose `__init__` this fix cannot find")
            function = inits[0]
            skip = 1
        else:
            function = node
        args = function.args
        if args.vararg is not None or args.kwarg is not None:
            raise Unfixable(f"{unseen}, which takes `*args`/`**kwargs`")
        if any(a.star for a in self.call.args):
            raise Unfixable(f"{unseen} beside `*`/`**` arguments")
        positional = [a.arg for a in [*args.posonlyargs, *args.args]][skip:]
        if arg.keyword is not None:
            name = arg.keyword.value
            if name not in [a.arg for a in args.args][skip:] + [a.arg for a in args.kwonlyargs]:
                raise Unfixable(f"{unseen}, which has no parameter `{name}`")
        else:
            index = [a for a in self.call.args if a.keyword is None].index(arg)
            if index >= len(positional):
                raise Unfixable(f"{unseen}, which has no parameter in that position")
            name = positional[index]
        return function, name

    def _loads(self, function: ast.FunctionDef, name: str, what: str) -> List[ast.Name]:
        """The loads of parameter `name` in `function`; any other binding of the name there (an
        assignment, a nested function's parameter) stops the plan."""
        loads: List[ast.Name] = []
        for statement in function.body:
            for node in ast.walk(statement):
                if isinstance(node, ast.Name) and node.id == name:
                    if not isinstance(node.ctx, ast.Load):
                        raise Unfixable(f"`{name}` is assigned again at {self._where(node)}: {what} cannot be followed there")
                    loads.append(node)
                elif isinstance(node, ast.arg) and node.arg == name:
                    raise Unfixable(f"`{name}` is bound again at {self._where(node)}: {what} cannot be followed there")
                elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                    raise Unfixable(f"`{name}` is declared global at {self._where(node)}: {what} cannot be followed there")
                elif isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    raise Unfixable(f"`{name}` is bound again at {self._where(node)}: {what} cannot be followed there")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                    raise Unfixable(f"`{name}` is bound again at {self._where(node)}: {what} cannot be followed there")
        return loads

    # ------------------------------------------------------------------ the scaler
    def _scaler_use(self, node: ast.expr, function: ast.FunctionDef, found: RemoteScaler, what: str) -> None:
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            if parent.attr not in _STATE:
                raise Unfixable(
                    f"`{ast.unparse(parent)}` at {self._where(parent)} is not part of the protocol timm's ApexScaler and "
                    "NativeScaler share"
                )
            found.checkpoints = True
        elif isinstance(parent, ast.Compare) and _compares_with_none(parent):
            return
        elif isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is node:
            return
        elif isinstance(parent, ast.BoolOp) or (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)):
            return
        elif isinstance(parent, ast.Call) and parent.func is node:
            found.calls.append(self._protocol_call(parent))
        elif (
            isinstance(parent, ast.Assign)
            and parent.value is node
            and isinstance(node, ast.Name)
            and function.name == "__init__"
            and isinstance(self.node, ast.ClassDef)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Attribute)
            and isinstance(parent.targets[0].value, ast.Name)
            and function.args.args
            and parent.targets[0].value.id == function.args.args[0].arg
            and self.parents.get(id(parent)) is function
        ):
            self._follow_attribute(parent.targets[0].attr, parent, found)
        else:
            raise Unfixable(f"{what} is used at {self._where(node)} in a way this fix cannot follow")

    def _follow_attribute(self, attr: str, stored: ast.Assign, found: RemoteScaler) -> None:
        """`self.amp_scaler = amp_scaler` in `__init__`: every `self.amp_scaler` of the class."""
        cls = self.node
        what = f"`self.{attr}` (the loss scaler, {self.relative})"
        inside = {id(n) for n in ast.walk(cls)}
        outside = next((n for n in ast.walk(self.tree) if isinstance(n, ast.Attribute) and n.attr == attr and id(n) not in inside), None)
        if outside is not None:
            raise Unfixable(f"`{ast.unparse(outside)}` at {self._where(outside)} may reach {what} from outside its class")
        for node in self.p.names.nodes_of_type((cst.Attribute,)):
            if node.attr.value == attr:
                raise Unfixable(
                    f"`{self.p.ctx.code(node).strip()}` at line {self.p.ctx.position(node).start.line} may reach {what} "
                    "from outside its class"
                )
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(method)):
                    raise Unfixable(f"{what} is named at {self._where(method)} outside a method")
                continue
            if not method.args.args:
                continue
            me = method.args.args[0].arg
            for node in ast.walk(method):
                if not (isinstance(node, ast.Attribute) and node.attr == attr):
                    continue
                if not (isinstance(node.value, ast.Name) and node.value.id == me):
                    raise Unfixable(f"`{ast.unparse(node)}` at {self._where(node)}: {what} may be reached other than through `{me}`")
                if not isinstance(node.ctx, ast.Load):
                    if self.parents.get(id(node)) is stored:
                        continue
                    raise Unfixable(f"{what} is assigned again at {self._where(node)}")
                self._scaler_use(node, method, found, what)

    def _protocol_call(self, call: ast.Call) -> RemoteCall:
        where = self._where(call)
        functions = self._key(call)
        positional = call.args
        if any(isinstance(a, ast.Starred) for a in positional) or any(k.arg is None for k in call.keywords) or len(positional) > _SAME_POSITIONS:
            raise Unfixable(
                f"the loss scaler's call at {where} passes arguments by position past `clip_grad` (or with `*`/`**`); "
                "timm's versions order them differently"
            )
        bound: Dict[str, ast.expr] = dict(zip(_SCALER_KEYWORDS, positional))
        for keyword in call.keywords:
            if keyword.arg not in _SCALER_KEYWORDS or keyword.arg in bound:
                raise Unfixable(f"the loss scaler's call at {where} passes `{keyword.arg}=`, which is not timm's scaler protocol")
            bound[keyword.arg] = keyword.value
        if "loss" not in bound or "optimizer" not in bound:
            raise Unfixable(f"the loss scaler's call at {where} does not pass the loss and the optimizer")
        clip = bound.get("clip_grad")
        if clip is None or _is_none(clip):
            return RemoteCall(functions, where)
        parameters = bound.get("parameters")
        if parameters is None or _is_none(parameters):
            raise Unfixable(
                f"the loss scaler's call at {where} clips without `parameters=`: timm's NativeScaler asserts it is given "
                "(ApexScaler clipped the optimizer's parameters)"
            )
        code = " ".join(ast.unparse(parameters).split())
        head = self._model_parameters(parameters)
        if head is False:
            return RemoteCall(
                functions,
                where,
                note=f"the clip at {where} now covers `{code}` where apex clipped the optimizer's parameters (the same "
                "gradients when the optimizer trains the whole model)",
            )
        if head is True:
            return RemoteCall(
                functions,
                where,
                unsafe=f"`{code}` at {where}: where `exclude_head` is true (timm's `clip_mode='agc'`) NativeScaler leaves "
                "the head's weight and bias unclipped, and ApexScaler clipped every parameter of the optimizer",
            )
        return RemoteCall(
            functions,
            where,
            unsafe=f"NativeScaler clips `{code}` ({where}) where ApexScaler clipped every parameter of the optimizer "
            "(`amp.master_params`)",
        )

    def _model_parameters(self, value: ast.expr) -> Optional[bool]:
        """False: `m.parameters()` or timm's `model_parameters(m)` (no head excluded); True: it may
        exclude the head; None: something else."""
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr == "parameters" and not value.args and not value.keywords:
            return False
        if self._qualified(func) not in TIMM_MODEL_PARAMETERS or not value.args:
            return None
        head = next((k.value for k in value.keywords if k.arg == "exclude_head"), None)
        if head is None and len(value.args) > 1:
            head = value.args[1]
        if head is None or (isinstance(head, ast.Constant) and head.value is False):
            return False
        return True

    def _qualified(self, func: ast.expr) -> str:
        """`model_parameters` -> `timm.models.model_parameters` where a top-level `from timm.models
        import model_parameters` of the file binds it (and nothing else binds it)."""
        spelled = dotted(func)
        head, _, rest = spelled.partition(".")
        found: Set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                for alias in node.names:
                    if (alias.asname or alias.name) == head:
                        found.add(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == head:
                        found.add(alias.name)
                    elif alias.asname is None and alias.name.split(".")[0] == head:
                        found.add(head)
            elif isinstance(node, ast.Name) and node.id == head and not isinstance(node.ctx, ast.Load):
                return ""
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
                return ""
        if len(found) != 1:
            return ""
        base = found.pop()
        return f"{base}.{rest}" if rest else base

    # ------------------------------------------------------------------ places
    def _key(self, node: ast.AST) -> List[Tuple[str, str]]:
        """The functions around `node`, outermost first, as (file, dotted name)."""
        names: List[str] = []
        owners: List[ast.AST] = []
        current = self.parents.get(id(node))
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                owners.append(current)
            current = self.parents.get(id(current))
        keys: List[Tuple[str, str]] = []
        for owner in reversed(owners):
            names.append(owner.name)
            if not isinstance(owner, ast.ClassDef):
                keys.append((self.path, ".".join(names)))
        return keys

    def _where(self, node: ast.AST) -> str:
        return f"{self.relative}:{getattr(node, 'lineno', 0)}"


def remote_callee(planner, call: cst.Call) -> Optional[RemoteCallee]:
    """The function or class of another file of the repository that `call` runs, per the project
    index; None where the callee is not one (not resolved to a file of the run, this file's own)."""
    index = planner.ctx.project_index
    func = call.func
    if index is None or not isinstance(func, (cst.Name, cst.Attribute)):
        return None
    names = planner.names
    if isinstance(func, cst.Name) and any(b.kind not in ("import", "from-import") for b in names.bindings_of(func)):
        return None
    qnames = names.qualified_names(func)
    if len(qnames) != 1:
        return None
    module, _, name = next(iter(qnames)).rpartition(".")
    here = os.path.abspath(planner.ctx.path)
    if not module or module.startswith("timm.") or module == "timm":
        return None
    found = candidates(index, here, module)
    if not found:
        return None
    if len(found) > 1:
        raise Unfixable(
            f"`{planner.ctx.code(func).strip()}` may come from " + " or ".join(index.relative(f) for f in found)
            + ": which file it runs is not known"
        )
    path = found[0]
    if path == here:
        return None
    tree = source_tree(index, path)
    if tree is None:
        raise Unfixable(f"{index.relative(path)} (defining `{name}`) changed since it was read, or does not parse")
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name]
    others = [
        n
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load))
        or (isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in n.names))
    ]
    if len(defs) != 1 or others:
        raise Unfixable(f"`{name}` of {index.relative(path)} is not bound by one top-level `def`/`class`")
    return RemoteCallee(planner, call, path, defs[0], tree)


def star_binds(planner, node: cst.ImportFrom, names: Tuple[str, ...]) -> Optional[str]:
    """For `from models.x import *` of a file of the repository: the first of `names` that it
    binds, "" for none; None where the module is not such a file or its exports are unsure."""
    index = planner.ctx.project_index
    if index is None or node.module is None:
        return None
    module = cst.Module([]).code_for_node(node.module)
    here = os.path.abspath(planner.ctx.path)
    if node.relative:
        package = index.package_of(here).split(".") if index.package_of(here) else []
        level = len(node.relative)
        package = package[: len(package) - (level - 1)] if level > 1 else package
        module = ".".join([*package, module])
    return _exported(index, here, module, names, 0)


def _exported(index, importer: str, module: str, names: Tuple[str, ...], depth: int) -> Optional[str]:
    found = candidates(index, importer, module)
    if len(found) != 1 or depth > 3:
        return None
    path = found[0]
    tree = source_tree(index, path)
    if tree is None:
        return None
    bound: Set[str] = set()
    stack: List[ast.stmt] = list(tree.body)
    declared: Optional[List[str]] = None
    alls = 0
    while stack:
        statement = stack.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(statement.name)
            continue
        if isinstance(statement, ast.ImportFrom) and any(a.name == "*" for a in statement.names):
            source = statement.module or ""
            if statement.level:
                package = index.package_of(path).split(".") if index.package_of(path) else []
                package = package[: len(package) - (statement.level - 1)] if statement.level > 1 else package
                source = ".".join([*package, *([source] if source else [])])
            if source == "timm" or source.startswith("timm."):
                continue  # timm's packages import their names one by one (api.STAR_EXPORTS)
            inner = _exported(index, path, source, names, depth + 1)
            if inner is None:
                return None
            if inner:
                bound.add(inner)
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
                if node.id == "__all__":
                    alls += 1
                    declared = _literal_names(statement)
            elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return None  # a star import under a condition: followed by no one
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name.split(".")[0]) for a in node.names if a.name != "*")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
    if "__all__" in bound:
        if declared is None or alls != 1:
            return None  # built at import time: its contents are unsure
        exported = set(declared)
    else:
        exported = {n for n in bound if not n.startswith("_")}
    return next((n for n in names if n in exported), "")


def _literal_names(statement: ast.stmt) -> Optional[List[str]]:
    if isinstance(statement, ast.Assign) and isinstance(statement.value, (ast.List, ast.Tuple)):
        values = statement.value.elts
        if all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
            return [v.value for v in values]
    return None


def _compares_with_none(comparison: ast.Compare) -> bool:
    return (
        len(comparison.ops) == 1
        and isinstance(comparison.ops[0], (ast.Is, ast.IsNot))
        and (_is_none(comparison.comparators[0]) or _is_none(comparison.left))
    )


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
