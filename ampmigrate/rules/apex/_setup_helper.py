"""apex set up in a helper function that returns the model and optimizer; the loss scaled by its callers.

The shape and the facts are engine/apex_setup_helper.py's. The migration:

- the helper's side (`_HelperSide`): `model, optimizer = amp.initialize(...)` goes, with the apex
  import it no longer needs; the helper keeps its signature and returns the same values (the
  model stays fp32);
- each caller (`_CallerSide`, in another file or in the helper's own): right after
  `model, optimizer = helper(...)`, `scaler = torch.amp.GradScaler("cuda", enabled=<the tests
  under which the helper called amp.initialize, in the caller's terms>)`; the rest is the in-file
  planner's (`scaler.scale(loss).backward()`, `scaler.step`/`update`, autocast around the forward
  pass, the scaler passed to the functions of the file that scale the loss).

The helper's `loss_scale` must be dynamic for every caller, its `opt_level` O1/O2 (a literal in
the helper, or a parameter whose value each caller gives as such, or its default), or O0 among them
(the caller's `enabled=` then gains `<level> != "O0"`), or known only at run time as the in-file
planner takes it: where the opt level is the helper's parameter, `amp.initialize` becomes
`if <param> == "O3": raise ValueError(...)` (pure fp16 has no torch.amp equivalent). Else every
side refuses with the reason. A caller that trains nothing through the helper (engine's
`inference_callers`) changes nothing; the helper's fix notes that its model now runs in fp32. Every file of the run calling the helper must be a caller that
migrates (a caller that scales no loss, an inference use, stops the group): each side plans the
others from the bytes the index read, as rules/apex/_cross_threading.py does.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import is_main_guard, is_pure, walk
from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.apex_setup_helper import (
    Helper,
    helper_callers,
    helper_of,
    helper_of_source,
    inference_callers,
    test_chains,
    helpers_called_by,
)
from ampmigrate.engine.context import FileContext, FixBuilder
from ampmigrate.rules.apex._amp_common import AmpPlan, Unfixable
from ampmigrate.rules.apex._amp_migration import NO_INIT_REASON, NO_STEP_REASON, _Planner
from ampmigrate.rules.apex._amp_options import NO_GROWTH_INTERVAL, ScalerSpec, _fp16_arm_test, _possible_levels, literal_value
from ampmigrate.rules.apex._init_enclosure import stores_in
from ampmigrate.rules.apex._cross_threading import _check_min_torch, _plan_elsewhere, _spelled
from ampmigrate.rules.apex.amp105_apex_amp_cast_annotations import _registration_autocast_keeps

_ATOMIC = (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.SimpleString, cst.Integer, cst.Float)


def setup_helper_planner(ctx: FileContext) -> Optional[_Planner]:
    """The planner for a file that defines or calls a setup helper (engine/apex_setup_helper.py);
    None for any other file."""
    index = ctx.project_index
    if index is None or "amp" not in ctx.text:
        return None
    try:
        tree = ast.parse(ctx.text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    path = os.path.abspath(ctx.path)
    helper, _ = helper_of(tree, path)
    scales = _scales_loss(tree)
    if helper is not None:
        if index.modules.get(path) is not None and index.modules[path].apex_init_calls:
            return None  # it hands the optimizer to a training function elsewhere (_cross_threading.py)
        called_here = _called_in_file(tree, helper.name)
        others, reason = helper_callers(index, path, helper.name)
        if called_here and scales:
            if others or reason:
                return _Refusing(ctx, f"`{helper.name}()` sets apex up for callers in this file and in others", NO_STEP_REASON)
            if not _only_called(tree, helper.name):
                return _Refusing(ctx, f"`{helper.name}()` is used otherwise than by calling it", NO_STEP_REASON)
            return _CallerSide(ctx, helper, frozenset({helper.name}), same_file=True)
        if called_here and not scales:
            return _NestedHelper(ctx, helper, _calling_functions(tree, helper.name))
        if scales:
            return None  # the in-file planner's (and its reasons)
        if reason:
            return _Refusing(ctx, reason, NO_STEP_REASON)
        if not others:
            return None
        return _HelperSide(ctx, helper, others)
    if not scales or _initializes(tree):
        return None
    called = helpers_called_by(index, path)
    if len(called) != 1:
        return None
    other, name, spellings = called[0]
    found, _ = helper_of_source(index, other)
    if found is None or found.name != name:
        return None  # not a setup helper: the other planners' shapes and reasons
    return _CallerSide(ctx, found, spellings, same_file=False)


def _calling_functions(tree: ast.Module, name: str) -> List[str]:
    """The top-level functions (or `Class.method`s) of the module that call `name`."""
    found: List[str] = []
    for node in tree.body:
        members = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):
            members = [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for label, function in members:
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(function)):
                found.append(label)
    return found


def _scales_loss(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "scale_loss" for n in ast.walk(tree))


def _initializes(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("initialize", "init") for n in ast.walk(tree))


def _only_called(tree: ast.Module, name: str) -> bool:
    """Every load of `name` in the module is the function of a call."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return all(
        id(n) in called for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    )


def _called_in_file(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))


def _group(ctx: FileContext, helper: Helper) -> Tuple[Optional[str], List[str]]:
    """(why the helper's file and its callers cannot migrate together or None, the unsafe reasons
    of any of them): every side planned from the bytes the index read."""
    index = ctx.project_index
    memo = index.__dict__.setdefault("_apex_setup_helper_groups", {})
    key = (helper.path, helper.name)
    if key not in memo:
        callers, reason = helper_callers(index, helper.path, helper.name)
        problem: Optional[str] = reason or None
        unsafe: List[str] = []
        if problem is None and not callers:
            problem = f"no file of the run calls `{helper.name}()`"
        for member in (helper.path, *callers) if problem is None else ():
            why, member_unsafe = _plan_elsewhere(ctx, member, setup_helper_planner)
            if why is not None:
                problem = f"{index.relative(member)} cannot be migrated with it: {why}"
                break
            unsafe.extend(u for u in member_unsafe if u not in unsafe)
        memo[key] = (problem, unsafe)
    return memo[key]


class _NestedHelper(_Planner):
    """The helper's own file calls it in functions that scale no loss (FARM's `optimize_model()`
    calling `_init_amp()`, jiant's `raw_special_model_setup()` calling `fp16ize()`): the in-file
    planner's plan, and where it finds no training step, its reason names those functions (a setup
    helper called by another helper, whose callers would have to create the GradScaler, is not
    followed)."""

    def __init__(self, ctx: FileContext, helper: Helper, calling: List[str]) -> None:
        super().__init__(ctx)
        self.helper = helper
        self.calling = calling

    def plan(self) -> AmpPlan:
        plan = super().plan()
        if plan.fix is None and plan.reason == NO_STEP_REASON:
            where = ", ".join(f"`{c}()`" for c in self.calling) or "this file"
            plan.reason = (
                f"{NO_STEP_REASON} (`{self.helper.name}()` sets apex up and returns the model and optimizer to "
                f"{where} in this file, where no loss is scaled: a setup helper called by another function that hands "
                "them on is not followed)"
            )
        return plan


class _Refusing(_Planner):
    """A side of a setup-helper group that cannot migrate: the reason, and no fix."""

    def __init__(self, ctx: FileContext, reason: str, prefix: str) -> None:
        super().__init__(ctx)
        self.reason = reason
        self.prefix = prefix

    def _build(self, plan: AmpPlan) -> Fix:
        raise Unfixable(f"{self.prefix} ({self.reason})")


def _chain(node: Optional[cst.BaseExpression]) -> str:
    """`args.fp16` as spelled; "?" for what is not a name or an attribute chain."""
    spelled = _spelled(node) if node is not None else ""
    return spelled or "?"


def _overlaps(stored: str, read: str, exact: bool) -> bool:
    """Whether assigning `stored` (with `exact`, that attribute; else anything below it) may change `read`."""
    if read.startswith("?"):
        return True
    if not exact:
        return read == stored or read.startswith(stored + ".")
    return read == stored or read.startswith(stored + ".") or stored.startswith(read + ".")


def _check_file(planner: _Planner) -> None:
    """What stops any apex migration of the file (star imports, unreached uses, re-exports)."""
    planner._check_star_refs()
    planner._check_unreached_uses()
    for binding in planner.usage.import_bindings:
        if planner.ctx.reexported(binding):
            raise Unfixable(f"`{binding.name}` is re-exported from here")
    planner._check_other_refs()


def _param_chain(node: Optional[ast.expr], helper: Helper) -> bool:
    """`args.fp16_opt_level`: an attribute chain on one of the helper's parameters."""
    if not isinstance(node, ast.Attribute):
        return False
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in helper.params + helper.kwonly


def _setup_statement(planner: _Planner, helper: Helper, inits) -> cst.BaseStatement:
    """The statement that sets apex up in the helper: the `amp.initialize` line, or the `if`
    whose arms are the inference and the training call (`Helper.arms_line`)."""
    lines = {planner._line(r.call): planner._init_line(r) for r in inits}
    line = lines.get(helper.init_line)
    if line is None or len(lines) != (2 if helper.arms_line else 1):
        raise Unfixable(f"{NO_STEP_REASON} (`amp.initialize` is not where the index read it)")
    if not helper.arms_line:
        return line
    arms = next((a for a in planner.names.ancestors(line) if isinstance(a, cst.If)), None)
    if arms is None or planner._line(arms) != helper.arms_line:
        raise Unfixable(f"{NO_STEP_REASON} (`amp.initialize` is not where the index read it)")
    planner.handled.update(lines.values())
    return arms


def _replace_init(planner: _Planner, helper: Helper, line: cst.BaseStatement) -> None:
    """The helper's `amp.initialize` line goes; where its opt level is the helper's parameter, it
    becomes `if <param> == "O3": raise ValueError(...)`: whatever a caller gives it, O3 (pure fp16,
    which torch.amp cannot do) stops there instead of training another way. The notes name the
    files calling the helper for inference, whose model now runs in fp32."""
    level = helper.options.get("opt_level")
    # `if optimizer is None: model = amp.initialize(model, ...); return model`: the inference arm's
    # own `return` stays, under the same test (`_inference_arm`)
    kept = []
    if isinstance(line, cst.If) and isinstance(line.body, cst.IndentedBlock) and isinstance(line.body.body[-1], cst.SimpleStatementLine) \
            and isinstance(line.body.body[-1].body[0], cst.Return):
        kept = [line.with_changes(body=line.body.with_changes(body=[line.body.body[-1]]), orelse=None, leading_lines=())]
    if (isinstance(level, ast.Name) and level.id in helper.params + helper.kwonly) or _param_chain(level, helper):
        quote = planner.ctx.quote
        spelled = ast.unparse(level)
        message = planner.ctx.string("apex opt_level O3 (pure fp16) has no torch.amp equivalent; use O1 or O2").value
        guard = planner.ctx.parse_statement(f"if {spelled} == {quote}O3{quote}:\n    raise ValueError({message})\n")
        planner.builder.replace(line, cst.FlattenSentinel([guard.with_changes(leading_lines=line.leading_lines), *kept]))
        planner._note(f"`{spelled}` O3 now raises where `amp.initialize` was")
    elif kept:
        planner.builder.replace(line, cst.FlattenSentinel([kept[0].with_changes(leading_lines=line.leading_lines)]))
    else:
        planner.removal.remove_statement(line)
    planner.handled.add(line)
    # `apex.amp.register_half_function(torch, "einsum")` beside it (DPR's helper): CUDA autocast
    # casts that op the same way (AMP105's fix); removed here too, so that the `try` importing apex
    # for both goes whole instead of being left with `pass`.
    for ref in planner.usage.refs:
        kept = _registration_autocast_keeps(planner.ctx, ref) if ref.api in ("register_half_function", "register_float_function") else None
        if kept is not None:
            planner.removal.remove_statement(kept[0])
            planner.handled.update((kept[0], ref.node))
            planner._note(f"CUDA autocast already casts `{kept[1]}` as its registration asked")
    index = planner.ctx.project_index
    for other, what in inference_callers(index, helper.path, helper.name):
        planner._note(
            f"{index.relative(other)} calls `{helper.name}()` for inference ({what}): without `amp.initialize` "
            'its model runs in fp32; wrap its inference in `torch.autocast("cuda", dtype=torch.float16)` for apex\'s fp16 speed'
        )


class _Init:
    """The helper's call standing where `amp.initialize` was, for the in-file planner."""

    api = "initialize"

    def __init__(self, call: cst.Call) -> None:
        self.call = call
        self.node = call.func
        self.via_handle = False


# ---------------------------------------------------------------------------------- the helper
class _HelperSide(_Planner):
    """The helper's file: its `amp.initialize` goes; its callers create the GradScaler."""

    verify = True

    def __init__(self, ctx: FileContext, helper: Helper, callers: List[str]) -> None:
        super().__init__(ctx)
        self.helper = helper
        self.callers = callers

    def _build(self, plan: AmpPlan) -> Fix:
        try:
            _check_file(self)
        except Unfixable as exc:
            raise Unfixable(f"{NO_STEP_REASON} ({exc})") from None
        stray = sorted({r.api for r in self.refs if r.api != "initialize"} - {None})
        if stray or any(r.api is None for r in self.refs):
            what = f"`amp.{stray[0]}`" if stray else "a test of apex's presence"
            raise Unfixable(f"{NO_STEP_REASON} (the file also uses {what}, which the setup-helper migration leaves)")
        if self.verify:
            problem, unsafe = _group(self.ctx, self.helper)
            if problem is not None:
                raise Unfixable(f"{NO_STEP_REASON} ({problem})")
            self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        _check_min_torch(self)
        inits = [r for r in self.refs if r.api == "initialize"]
        if any(init.call is None for init in inits):
            raise Unfixable(f"{NO_STEP_REASON} (`amp.initialize` is used without being called)")
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        _replace_init(self, self.helper, _setup_statement(self, self.helper, inits))
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        index = self.ctx.project_index
        callers = ", ".join(index.relative(c) for c in self.callers)
        return self._finish(
            f"Migrate apex.amp to torch.amp: `amp.initialize` in `{self.helper.name}()` goes (the model stays fp32, "
            f"its signature and return values are kept); {callers} create the torch.amp.GradScaler after calling it "
            "and autocast the forward pass"
        )


# ---------------------------------------------------------------------------------- a caller
class _CallerSide(_Planner):
    """A caller of the helper: the scaler is created right after the call."""

    verify = True

    def __init__(self, ctx: FileContext, helper: Helper, spellings: frozenset, same_file: bool) -> None:
        super().__init__(ctx)
        self.helper = helper
        self.spellings = spellings
        self.same_file = same_file

    def plan(self) -> AmpPlan:
        if self.same_file:
            plain = _Planner(self.ctx).plan()  # the in-file migration first, where it takes the file
            if plain.fix is not None:
                return plain
        return super().plan()

    def _build(self, plan: AmpPlan) -> Fix:
        prefix = NO_STEP_REASON if self.same_file else NO_INIT_REASON
        try:
            return self._build_caller(plan)
        except Unfixable as exc:
            if self.same_file or not self.verify:  # (planned from another side of the group: the bare reason)
                raise
            raise Unfixable(f"{prefix} (`{self.helper.name}()` sets apex up: {exc})") from None

    def _build_caller(self, plan: AmpPlan) -> Fix:
        _check_file(self)
        allowed = {None, "pass", "scale_loss", "master_params", "state_dict", "load_state_dict", "initialize"}
        stray = sorted({r.api for r in self.refs} - allowed, key=str)
        if stray:
            raise Unfixable(f"the file also uses `amp.{stray[0]}`, which the setup-helper migration does not rewrite")
        inits = [r for r in self.refs if r.api in ("initialize", "init")]
        if self.same_file:
            ours = [r for r in inits if r.call is not None and self._line(r.call) == self.helper.init_line]
            if len(ours) != 1 or len(inits) != (2 if self.helper.arms_line else 1):
                raise Unfixable("`amp.initialize` is called outside the setup helper")
        elif inits:
            raise Unfixable("the file calls `amp.initialize` itself")
        if self.verify and not self.same_file:
            problem, unsafe = _group(self.ctx, self.helper)
            if problem is not None:
                raise Unfixable(problem)
            self.unsafe.extend(u for u in unsafe if u not in self.unsafe)
        _check_min_torch(self)
        call, line, target = self._the_call()
        handed = [r for r in self.refs if r.api in (None, "pass") and any(a is call for a in self.names.ancestors(r.node))]
        if handed:
            # The helper tests or uses the module beyond `amp.initialize` (`if amp:`, its state): the
            # GradScaler made after the call reaches neither, and the caller's `amp` goes with apex.
            raise Unfixable(
                f"`{self.helper.name}()` is handed apex's amp module at line {self._line(handed[0].node)}, which it uses "
                "beyond `amp.initialize`: the GradScaler made after the call cannot stand in for it there"
            )
        self.home = self._function_scope(call)
        owner = self.home.parent
        if owner is not None and owner.kind == "class":  # a method of a top-level class: `self.scaler`
            owner = owner.parent
        if self.home.kind == "module":
            pass  # a script's top level (OVANet's `G, C1, ..., opt_g, opt_c, ... = get_models(inputs)`)
        elif self.home.kind != "function" or owner is not self.names.module_scope:
            raise Unfixable(f"`{self.helper.name}()` is not called at a script's top level, in a top-level function or in a method of a top-level class")
        for ancestor in self.names.ancestors(line):
            if ancestor is self.home.node:
                break
            if self.home.kind == "module" and is_main_guard(ancestor) and self.names.parent(ancestor) is self.home.node:
                continue  # `if __name__ == "__main__":` at a script's top level runs once, as the top level does
            if isinstance(ancestor, (cst.For, cst.While, cst.Try, cst.ExceptHandler, cst.Finally)):
                raise Unfixable(f"`{self.helper.name}()` is called under a loop or a `try`")
        self.spec = self._spec(call, target)
        self.fp32 = False
        self.setup_guards = []
        self.builder = FixBuilder("", SAFE, frozenset({s.code for s in plan.sites}))
        self.init = _Init(call)
        self.init_line = line
        steps = [self._step(r) for r in self.refs if r.api == "scale_loss"]
        if not steps:
            raise Unfixable(f"no `amp.scale_loss` after `{self.helper.name}()` in this file")
        if self.same_file:
            _replace_init(self, self.helper, _setup_statement(self, self.helper, inits))
        self._plan_fp16(steps)
        self._check_half_inputs(steps)
        self._plan_imports()
        self._emit_removals()
        self._check_nesting()
        where = "" if self.same_file else f" (in {self.ctx.project_index.relative(self.helper.path)})"
        return self._finish(
            f"Migrate apex.amp to torch.autocast fp16 and torch.amp.GradScaler: the GradScaler is created after "
            f"`{self.helper.name}()`{where}, which set apex up and no longer calls `amp.initialize`"
        )

    # ---- the call of the helper
    def _the_call(self) -> Tuple[cst.Call, cst.SimpleStatementLine, cst.BaseExpression]:
        calls = [
            node
            for node in self.names.nodes_of_type(cst.Call)
            if _spelled(node.func) in self.spellings
        ]
        if len(calls) != 1:
            raise Unfixable(f"`{self.helper.name}()` is called {len(calls)} times in this file (one call, one scaler)")
        call = calls[0]
        small = self.names.parent(call)
        line = self.names.parent(small)
        if not (
            isinstance(small, cst.Assign)
            and small.value is call
            and len(small.targets) == 1
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            raise Unfixable(f"the result of `{self.helper.name}()` is not unpacked by an assignment of its own line")
        target = small.targets[0].target
        if not (
            isinstance(target, (cst.Tuple, cst.List))
            and len(target.elements) == self.helper.returns
            and all(_target_name(e.value) and not isinstance(e, cst.StarredElement) for e in target.elements)
        ):
            raise Unfixable(f"the result of `{self.helper.name}()` is not unpacked into {self.helper.returns} names")
        return call, line, target

    def _bound(self, call: cst.Call) -> Dict[str, cst.BaseExpression]:
        helper = self.helper
        bound: Dict[str, cst.BaseExpression] = {}
        position = 0
        for arg in call.args:
            if arg.star:
                raise Unfixable(f"`{helper.name}()` is called with `*`/`**` arguments")
            if arg.keyword is None:
                if position >= len(helper.params):
                    raise Unfixable(f"`{helper.name}()` is called with more arguments than it takes")
                bound[helper.params[position]] = arg.value
                position += 1
            else:
                name = arg.keyword.value
                if name not in helper.params + helper.kwonly or name in bound:
                    raise Unfixable(f"`{helper.name}()` is called with `{name}=`, which it does not take once")
                bound[name] = arg.value
        return bound

    def _shared_global(self, name: str) -> bool:
        """`name` means the same in the helper and at its call: a global of this file (UCSNet's
        `is_distributed`) that neither the helper nor the caller binds, the helper in this file."""
        module = self.names.module_scope
        if not self.same_file or not module.bindings.get(name):
            return False
        helpers = [s for s in self.names.scopes if s.parent is module and getattr(s.node, "name", None) is not None
                   and isinstance(s.node, cst.FunctionDef) and s.node.name.value == self.helper.name]
        if len(helpers) != 1 or name in helpers[0].bindings:
            return False
        return self.home is module or name not in self.home.bindings

    def _spec(self, call: cst.Call, target: cst.BaseExpression) -> ScalerSpec:
        helper = self.helper
        bound = self._bound(call)
        # `self.model, optimizer = to_fp16(self.model, optimizer, level)`: what each target rebinds,
        # by the name it starts from (a test reading `self.x` is not told apart from `self.model`)
        targets = {_target_name(e.value) for e in target.elements}
        roots: Set[str] = set()

        def value(param: str):
            if param in bound:
                return bound[param]
            if param in helper.defaults:
                return helper.defaults[param]
            raise Unfixable(f"`{helper.name}()` is called without `{param}`")

        def operand(node: ast.expr) -> str:
            code = translate(node)
            atomic = isinstance(node, (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Call))
            return code if atomic else f"({code})"

        def translate(node: ast.expr) -> str:
            if isinstance(node, ast.Name) and node.id in ("True", "False", "None"):
                return node.id
            if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str, type(None))):
                return self.ctx.string(node.value).value if isinstance(node.value, str) else repr(node.value)
            if isinstance(node, ast.Name) and node.id in helper.params + helper.kwonly:
                given = value(node.id)
                if isinstance(given, ast.expr):  # the helper's default
                    if not isinstance(given, ast.Constant):
                        raise Unfixable(f"the default of `{node.id}` in `{helper.name}()` is not a literal")
                    return translate(given)
                if not is_pure(given):
                    raise Unfixable(f"the argument given for `{node.id}` has side effects")
                root = given
                while isinstance(root, (cst.Attribute, cst.Subscript)):
                    root = root.value
                if isinstance(root, cst.Name):
                    roots.add(root.value)
                code = self.ctx.code(given).strip()
                return code if isinstance(given, _ATOMIC) else f"({code})"
            if isinstance(node, ast.Name) and self._shared_global(node.id):
                roots.add(node.id)
                return node.id
            if isinstance(node, ast.Attribute):
                return f"{operand(node.value)}.{node.attr}"
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                return f"not {operand(node.operand)}"
            if isinstance(node, ast.BoolOp):
                joiner = " and " if isinstance(node.op, ast.And) else " or "
                return joiner.join(operand(v) for v in node.values)
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                ops = {ast.Eq: "==", ast.NotEq: "!=", ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<=", ast.Is: "is", ast.IsNot: "is not"}
                op = ops.get(type(node.ops[0]))
                if op is not None:
                    return f"{operand(node.left)} {op} {operand(node.comparators[0])}"
            raise Unfixable(
                f"`{helper.name}()` sets apex up under a test (`{ast.unparse(node)}`) that cannot be spelled in its caller's terms"
            )

        spec = ScalerSpec(levels=set())
        for test, taken in helper.tests:
            if taken:
                code = translate(test)
            elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                code = translate(test.operand)  # `if not fp16: ... else: amp.initialize(...)`
            else:
                code = f"not {operand(test)}"
            try:
                spec.add_enabled(code, cst.parse_expression(code))
            except cst.ParserSyntaxError:
                raise Unfixable(f"the apex test of `{helper.name}()` cannot be spelled in its caller's terms") from None
        # what the helper may change before its test: the attributes the test reads
        read_nodes = [test for test, _ in helper.tests] + [
            o for o in [helper.options.get("opt_level"), helper.options.get("loss_scale")] if o is not None
        ]
        reads = [
            _chain(bound.get(param)) + suffix
            for test in read_nodes
            for param, suffix in test_chains(test, helper.params + helper.kwonly)
            if param in bound
        ]
        for param, attribute in helper.stores:
            stored = _chain(bound.get(param)) + (f".{attribute}" if attribute else "")
            if stored.startswith("?"):
                continue  # not an object the caller names
            if any(_overlaps(stored, read, bool(attribute)) for read in reads):
                raise Unfixable(f"`{helper.name}()` assigns `{param}{'.' + attribute if attribute else '[...]'}`, which its apex test reads")
        if roots & targets:
            raise Unfixable(f"the call of `{helper.name}()` rebinds `{sorted(roots & targets)[0]}`, which its apex test reads")
        # the opt level and the loss scale, in the caller's terms
        spec.levels = self._option_levels(value, helper.options.get("opt_level"), spec, roots, translate)
        if roots & targets:
            raise Unfixable(f"the call of `{helper.name}()` rebinds `{sorted(roots & targets)[0]}`, which its apex setup reads")
        scale = helper.options.get("loss_scale")
        if _param_chain(scale, helper):
            # `opt.apex_loss_scale` of the helper's `opt`: known only at run time, in the caller's
            # terms, as the in-file migration reads a run-time scale (rules/apex/_amp_options.py)
            given = translate(scale)
            dynamic = f"{given} in (None, {self.ctx.quote}dynamic{self.ctx.quote})"
            spec.keywords.append(("init_scale", f"65536.0 if {dynamic} else float({given})"))
            spec.keywords.append(("growth_interval", f"2000 if {dynamic} else {NO_GROWTH_INTERVAL}"))
            self._note(
                f"`{given}` (the loss scale of `{helper.name}()`) is known only at run time: None or \"dynamic\" keep "
                "GradScaler's dynamic scale, a number becomes `init_scale` with growth disabled as far as GradScaler "
                "allows (it still skips a step and halves the scale on inf/NaN, where apex applied it)"
            )
            scale = None
        if scale is not None:
            if isinstance(scale, ast.Name) and scale.id in helper.params + helper.kwonly:
                scale = value(scale.id)
            try:
                given = literal_value(scale) if isinstance(scale, cst.CSTNode) else ast.literal_eval(scale)
            except (ValueError, SyntaxError, TypeError):
                given = object()
            if given not in (None, "dynamic"):
                raise Unfixable(
                    f"the loss scale `{helper.name}()` passes to `amp.initialize` is not 'dynamic' here (a static or "
                    "run-time scale, which GradScaler cannot keep)"
                )
        spec.models = target.elements[helper.model_index].value
        spec.optimizers = target.elements[helper.optimizer_index].value
        self.spec_roots = roots  # the caller's names the setup's tests and options read
        return spec

    def _option_levels(self, value, node: Optional[ast.expr], spec: ScalerSpec, roots: Set[str], translate) -> Set[str]:
        """The opt levels the helper's `amp.initialize` runs with for this caller. O1 and O2 become
        fp16 autocast + GradScaler; a level that may be O0 (fp32 in apex) disables both for it
        (`enabled=` gains `<level> != "O0"` in the caller's terms); a level known only at run time
        also may be O3, which the helper's guard (`_HelperSide`) stops with an error where
        `amp.initialize` was, as the in-file planner does (rules/apex/_amp_migration.py)."""
        helper = self.helper
        if node is None:
            return {"O1"}
        levels: Optional[Set[str]] = None
        given = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            levels = {node.value}
        elif isinstance(node, ast.Attribute) and _param_chain(node, helper):
            # `args.fp16_opt_level` of the helper's `args`: known only at run time, in the caller's terms
            code = translate(node)
            condition = f"{code} != {self.ctx.quote}O0{self.ctx.quote}"
            spec.add_enabled(condition, cst.parse_expression(condition))
            spec.opt_level_code = code
            self._note(
                f"`{code}` (the opt level of `{helper.name}()`) is known only at run time: O0 disables the "
                "scaler and autocast, O1 and O2 run fp16 autocast, and O3 (pure fp16, which torch.amp cannot "
                f"do) now raises in `{helper.name}()` where `amp.initialize` was"
            )
            return {"O0", "O1", "O2", "O3"}
        elif isinstance(node, ast.Name) and node.id in helper.params + helper.kwonly:
            given = value(node.id)
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                levels = {given.value}
            elif isinstance(given, cst.CSTNode):
                levels = _possible_levels(self.names, given)
                if levels is None:  # known only at run time
                    if not is_pure(given):
                        raise Unfixable(f"the opt level given to `{helper.name}()` has side effects")
                    code = self.ctx.code(given).strip()
                    operand = code if isinstance(given, _ATOMIC) else f"({code})"
                    condition = f"{operand} != {self.ctx.quote}O0{self.ctx.quote}"
                    spec.add_enabled(condition, cst.parse_expression(condition))
                    spec.opt_level_code = code
                    self._add_root(given, roots)
                    self._note(
                        f"`{code}` (the opt level of `{helper.name}()`) is known only at run time: O0 disables the "
                        "scaler and autocast, O1 and O2 run fp16 autocast, and O3 (pure fp16, which torch.amp cannot "
                        f"do) now raises in `{helper.name}()` where `amp.initialize` was"
                    )
                    return {"O0", "O1", "O2", "O3"}
        if levels is not None and not levels <= {"O0", "O1", "O2", "O3"}:
            raise Unfixable(f"the opt level `{helper.name}()` passes to `amp.initialize` is {sorted(levels)}, which apex rejects")
        if levels is None or not levels or "O3" in levels or levels == {"O0"}:
            shown = sorted(levels) if levels else "not a string the fix can read"
            raise Unfixable(
                f"the opt level `{helper.name}()` passes to `amp.initialize` is {shown} here; the setup-helper "
                "migration takes O1 or O2 (O0 among them at run time)"
            )
        if "O0" in levels:  # `"O1" if args.fp16 else "O0"`: fp32 on one arm
            chosen = _fp16_arm_test(given, lambda n: self.ctx.code(n)) if isinstance(given, cst.CSTNode) else None
            if chosen is not None:
                spec.add_enabled(*chosen)
            else:
                code = self.ctx.code(given).strip()
                operand = code if isinstance(given, _ATOMIC) else f"({code})"
                condition = f"{operand} != {self.ctx.quote}O0{self.ctx.quote}"
                spec.add_enabled(condition, cst.parse_expression(condition))
            self._add_root(given, roots)
        return levels

    @staticmethod
    def _add_root(given: cst.CSTNode, roots: Set[str]) -> None:
        root = given
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        if isinstance(root, cst.Name):
            roots.add(root.value)

    # ---- the scaler, right after the call
    def _rebinding(self) -> Optional[str]:
        return None  # the helper's call stays

    def _place_home(self, creation: Optional[str]) -> None:
        if creation is None:
            return
        hoist = self.access.hoist_before
        # made before the `if` around the call, not before some earlier use of the scaler
        around = hoist is None or (
            self.home.kind == "function" and isinstance(hoist, cst.If)
            and any(a is hoist for a in self.names.ancestors(self.init_line))
            and not self._changed_in(hoist, creation)
        )
        if getattr(self.access, "detached_init", None) is not None or not around:
            raise Unfixable(
                f"the GradScaler cannot be created right after `{self.helper.name}()`: code outside the `if` around "
                "that call, or run before it, uses the scaler"
            )
        if hoist is not None:
            # `if fp16: model, optimizer = to_fp16(model, optimizer, level)`, the scaler used after the
            # `if`: made before it, enabled by its test too (_scaler_access._plan_enabled), as the
            # in-file migration makes it for `amp.initialize` under an `if`
            self.hoisted = (hoist, self.ctx.parse_statement(creation + "\n"))
            return
        self.builder.insert_after(self.init_line, self.ctx.parse_statement(creation + "\n"))

    def _changed_in(self, hoist: cst.CSTNode, creation: str) -> bool:
        """The `if` the scaler would be made before writes a name the setup's options read (in the
        caller's terms) or its creation reads: made before it, the scaler would read them too early."""
        roots = set(getattr(self, "spec_roots", set()))
        roots |= {n.value for n in walk(self.ctx.parse_statement(creation + "\n")) if isinstance(n, cst.Name)}
        return any(written.split(".")[0] in roots for written in stores_in(hoist))


def _target_name(node: cst.BaseExpression) -> str:
    """The name an unpacking target is or starts from (`model`, `self` of `self.model`); "" for
    anything else (a subscript, a starred name)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""
