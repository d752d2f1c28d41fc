"""timm's loss scalers under apex: `loss_scaler = ApexScaler()` beside `amp.initialize`.

timm's train.py (before 2023) and the vision repositories that copied it choose the mixed
precision in one place and train through two variables alone:

    amp_autocast = suppress  # do nothing
    loss_scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = ApexScaler()
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()
    ...
    with amp_autocast():            # in train_one_epoch(..., amp_autocast=..., loss_scaler=...)
        loss = loss_fn(model(x), y)
    loss_scaler(loss, optimizer, clip_grad=..., parameters=...)

The file never calls `amp.scale_loss`: timm's ApexScaler does. timm's two scalers share one call
protocol (api.TIMM_APEX_SCALERS), and under O1 (fp16 casts, a dynamic loss scale with
GradScaler's defaults) the native arm is the apex arm's torch.amp counterpart. So the apex arm
becomes it: `amp.initialize` goes, the arm binds the autocast variable to fp16 `torch.autocast`
(as the native arm does), and `ApexScaler()` becomes `NativeScaler()`. Apex O1 patched torch
everywhere, validation included; the autocast variable reaches the same places.

The autocast variable is the name that a do-nothing context (`suppress`, `nullcontext`) binds
before the apex arm (the nearest binding found with analysis/statements.py) and that, followed
through this file's calls, is entered as `with X():` in a function that calls the loss scaler.
The plan stops with the reason (`Unfixable`) when apex asked for more than NativeScaler does
(O0/O3, a static loss scale, `enabled=`, `num_losses`; O2 and the other overrides are decided as
the in-file planner's `scaler_spec` does), when that variable cannot be found, when apex.amp is
used otherwise in the file, or when a use of the scaler or the variable leaves what this file
and the files of the repository it calls (_timm_remote.py, by the project index) show. A call clipping through the scaler is where the two differ: ApexScaler clipped
every parameter of the optimizer (`amp.master_params`), NativeScaler clips the `parameters=` it
is given; `model.parameters()` is the same set (the note says so), anything else is unsafe.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import preceding
from ampmigrate.api import (
    ANY_AUTOCAST,
    NULL_CONTEXTS,
    TIMM_APEX_SCALERS,
    TIMM_MODEL_PARAMETERS,
    TIMM_NATIVE_SCALERS,
    TIMM_SCALER_STATE_USERS,
)
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.names import Binding
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._amp_options import (
    INITIALIZE_PARAMS,
    bound_arguments,
    literal_value,
)
from ampmigrate.rules.apex._timm_agc_guard import agc_guard
from ampmigrate.rules.apex._timm_remote import RemoteCall, RemoteWith, remote_callee, star_binds

# timm's `__call__(loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None,
# create_graph=False, need_update=True)`; timm 0.1 had `(loss, optimizer, clip_grad=None,
# parameters=None, create_graph=False)`: only the first three are in the same place in both.
SCALER_CALL_PARAMS = ("loss", "optimizer", "clip_grad", "clip_mode", "parameters", "create_graph", "need_update")
_SAME_POSITIONS = 3
_DEPTH = 3  # calls followed from the setup into this file's functions

CHECKPOINT_NOTE = (
    "checkpoints keep the scaler's state under the key `amp_scaler` (NativeScaler's) instead of `amp`: "
    "resuming from an apex checkpoint starts the loss scale afresh"
)


def timm_scaler_fix(planner) -> Optional[Fix]:
    """The fix for a file whose `amp.initialize` has timm's ApexScaler beside it and no
    `amp.scale_loss`; None when the file makes no ApexScaler of timm's."""
    calls = _apex_scaler_calls(planner)
    if not calls:
        _check_lookalike(planner)
        return None
    return _TimmScaler(planner, calls).fix()


def _check_lookalike(planner) -> None:
    """A class of the repository called `ApexScaler` (a copy of timm's, or another): its protocol
    is not known, so the plan stops saying so rather than with the general reason."""
    for call in planner.names.nodes_of_type((cst.Call,)):
        func = call.func
        spelled = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        if spelled == "ApexScaler":
            qnames = sorted(planner.names.qualified_names(func))
            what = f"`{qnames[0]}`" if qnames else "a class of this file"
            raise Unfixable(
                f"`ApexScaler()` at line {planner.ctx.position(call).start.line} is {what}, not timm's: what its "
                "calls run is not known, so the training step of `amp.initialize` is not in sight"
            )


def _apex_scaler_calls(planner) -> List[Tuple[cst.Call, str]]:
    """`ApexScaler()` calls resolving to timm's class, with the NativeScaler name each maps to."""
    found = []
    for node, qnames in planner.names.find(TIMM_APEX_SCALERS):
        call = planner.names.parent(node)
        if isinstance(call, cst.Call) and call.func is node:
            found.append((call, TIMM_APEX_SCALERS[min(qnames)]))
    return found


class _TimmScaler:
    def __init__(self, planner, calls: List[Tuple[cst.Call, str]]) -> None:
        self.p = planner
        self.names = planner.names
        self.ctx = planner.ctx
        self.calls = calls
        self.checkpoints = False
        self.autocast_withs: List = []
        self.remotes: List = []  # the other files' callees the scaler and the autocast reach
        self.autocast_problem = ""  # why a candidate autocast variable could not be followed
        self.scaler_line: Optional[cst.SimpleStatementLine] = None  # `loss_scaler = ApexScaler()`
        self.guards: List[str] = []  # raised in the apex arm where NativeScaler would clip otherwise

    # ------------------------------------------------------------------ entry
    def fix(self) -> Fix:
        p = self.p
        self._check_options()
        self._check_other_refs()
        if len(self.calls) != 1:
            raise Unfixable(
                "timm's `ApexScaler()` is created more than once in this file (line "
                + ", ".join(str(self._line(c)) for c, _ in self.calls)
                + "): one scaler per setup is what the fix follows"
            )
        call, native = self.calls[0]
        line, scaler = self._scaler_line(call)
        self.scaler_line = line
        if call.args:
            raise Unfixable(f"`ApexScaler(...)` at line {self._line(call)} is given arguments timm's class does not take")
        scaler_calls = self._scaler_uses(scaler, line)
        if not scaler_calls:
            raise Unfixable(
                f"`{scaler.value}` (timm's ApexScaler, line {self._line(call)}) is never called in this file: the "
                "training step that runs it is elsewhere"
            )
        autocast = self._autocast_variable(line, {f for c in scaler_calls for f in self._functions_around(c)})
        for scaler_call in scaler_calls:
            self._check_clip(scaler_call)
        self._check_with_arguments(autocast)
        self._check_half_inputs()
        # ---- emit
        p._place_home(None)  # `amp.initialize` goes (a rebinding to other names stays)
        self._respell_scaler(call, native)
        torch = p._torch(line)
        partial = self._partial(line)
        cuda = self.ctx.string("cuda").value
        bind = self.ctx.parse_statement(f"{autocast} = {partial}({torch}.autocast, {cuda}, dtype={torch}.float16)\n")
        p.builder.insert_after(line, bind, *(self.ctx.parse_statement(g) for g in self.guards))
        if self.checkpoints:
            p._note(CHECKPOINT_NOTE)
        p._plan_presence_tests()
        p._plan_imports()
        p._emit_removals()
        p._check_nesting()
        return p._finish("Migrate apex.amp with timm's ApexScaler to timm's NativeScaler and fp16 `torch.autocast`")

    def _partial(self, at: cst.CSTNode) -> str:
        """How to spell `functools.partial` at `at`: the file's own `partial`, else `functools`
        (imported when missing). A `from timm... import *` binds no `functools` (timm's packages
        import their names one by one), and the project index shows what a file of the
        repository star-exports; under such star imports alone the name is free."""
        name, _ = self.ctx.module_reference(at, "functools.partial")
        if name is not None:
            return name
        functools, needs_import = self.ctx.module_reference(at, "functools")
        if (
            functools is None
            and self.names.has_star_import
            and not any("functools" in scope.bindings for scope in self.names.scopes)
            and self._star_imports_free()  # or it stops here, saying which star import
        ):
            functools, needs_import = "functools", True
        if functools is None:
            raise Unfixable("the name `functools` is taken in this file, so the fp16 autocast cannot be spelled")
        if needs_import:
            self.p.builder.require_import("functools")
        return f"{functools}.partial"

    def _star_imports_free(self) -> bool:
        """Every `from X import *` of the file leaves `functools` and `partial` alone: X is timm's,
        or a file of the repository whose exports the project index shows (_timm_remote.py);
        a star import binding either name, or that cannot be resolved, stops the plan saying so."""
        stars = [node for node in self.names.nodes_of_type((cst.ImportFrom,)) if isinstance(node.names, cst.ImportStar)]
        for node in stars:
            module = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
            if not node.relative and (module == "timm" or module.startswith("timm.")):
                continue
            spelled = "." * len(node.relative) + module
            binds = star_binds(self.p, node, ("functools", "partial"))
            if binds is None:
                raise Unfixable(
                    f"`from {spelled} import *` (line {self._line(node)}) may bind `functools` here, and it is not a file "
                    "of the repository whose names can be read, so the fp16 autocast cannot be spelled: import "
                    "`functools` (or `partial`) by name first"
                )
            if binds:
                raise Unfixable(
                    f"`from {spelled} import *` (line {self._line(node)}) binds `{binds}` here, so the fp16 autocast "
                    "cannot be spelled: import `functools` (or `partial`) by name after it"
                )
        return bool(stars)

    # ------------------------------------------------------------------ what apex asked for
    def _check_options(self) -> None:
        spec, init = self.p.spec, self.p.init
        if init.api != "initialize":
            raise Unfixable("timm's ApexScaler beside the old `amp.init()` handle API is not a shape the fix follows")
        if not spec.levels or not spec.levels <= {"O1", "O2"}:
            levels = "/".join(sorted(spec.levels))
            runs = "runs" if len(spec.levels) == 1 else "may run (known only at run time)"
            raise Unfixable(
                f"`amp.initialize` at line {self._line(init.call)} {runs} opt level {levels}: timm's NativeScaler arm is "
                "fp16 autocast over fp32 weights with a dynamic loss scale, the counterpart of apex's O1 and O2 only"
            )
        bound = bound_arguments(init.call, INITIALIZE_PARAMS) or {}
        loss_scale = bound.get("loss_scale")
        if loss_scale is not None:
            try:
                value = literal_value(loss_scale.value)
            except ValueError:
                value = object()
            if value not in (None, "dynamic"):
                raise Unfixable(
                    f"`loss_scale={self.ctx.code(loss_scale.value).strip()}` of `amp.initialize` at line "
                    f"{self._line(init.call)}: timm's NativeScaler makes its GradScaler with the dynamic defaults, "
                    "so apex's loss scale cannot be kept"
                )
        # The in-file planner's decision (_amp_options.scaler_spec): O2 (and overrides that keep
        # an fp16 level's meaning, `keep_batchnorm_fp32=True`) become fp16 autocast over fp32
        # weights; overrides that change numerics are its unsafe reasons. What NativeScaler (a
        # default GradScaler, always on, one loss) cannot take stops here.
        losses = bound.get("num_losses")
        if losses is not None:
            try:
                single = literal_value(losses.value) == 1
            except ValueError:
                single = False
            if not single:
                raise Unfixable(
                    f"`amp.initialize` at line {self._line(init.call)} sets `num_losses=`: timm's NativeScaler is one "
                    "loss scaler"
                )
        if spec.keywords or spec.enabled or spec.error:
            what = "`enabled=`" if spec.enabled else f"`{spec.keywords[0][0]}`" if spec.keywords else "its options"
            raise Unfixable(
                f"`amp.initialize` at line {self._line(init.call)} asks for {what}, which timm's NativeScaler "
                "(a default GradScaler, always on) cannot reproduce"
            )
        self.p.unsafe.extend(u for u in spec.unsafe if u not in self.p.unsafe)
        if "O2" in spec.levels:
            self.p._note(
                "apex O2 cast the model to fp16 with fp32 master weights; torch.amp keeps the weights in fp32 and casts "
                "under the fp16 autocast"
            )
        for note in spec.notes:
            self.p._note(note)

    def _check_with_arguments(self, autocast: str) -> None:
        """`with amp_autocast(dtype=args.dtype):`: the do-nothing context of the apex arm took no
        such argument (`suppress(dtype=...)` raises TypeError), the fp16 autocast now takes it."""
        for w in self.autocast_withs:
            if isinstance(w, RemoteWith):
                keywords, where = w.keywords, w.where
            else:
                keywords, where = [a.keyword.value for a in w.args if a.keyword is not None], f"line {self._line(w)}"
            if keywords:
                self.p.unsafe.append(
                    f"`{autocast}({keywords[0]}=...)` at {where}: apex's arm entered the do-nothing context with it, which "
                    "raises TypeError, and the fp16 autocast now takes it"
                    + (" (its dtype overrides apex's fp16)" if "dtype" in keywords else "")
                )
                return

    def _check_half_inputs(self) -> None:
        """apex's fp16 casts (O1's patched functions, O2's fp16 model) ran everywhere; the autocast
        variable covers only where it is entered: a half cast elsewhere feeding the model stops
        the plan, as in the in-file planner (_multi_init.py `_check_half_inputs`)."""
        homes = {self._function_of(w) for w in self.autocast_withs if not isinstance(w, RemoteWith)}
        self.p._check_half_inputs([SimpleNamespace(function=SimpleNamespace(node=f)) for f in homes])
        for remote in self.remotes:
            where = remote.half_casts()
            if where is not None:
                raise Unfixable(
                    f"{where} casts to half: apex's fp16 model (or O1's casts) took such values, and whether the migrated "
                    "code runs it under the autocast is not followed into that file"
                )

    def _check_other_refs(self) -> None:
        for ref in self.p.refs:
            if ref is self.p.init or ref.api in (None, "pass"):
                continue
            raise Unfixable(
                f"`{self.ctx.code(ref.node).strip()}` at line {self._line(ref.node)} uses apex.amp beside timm's "
                "ApexScaler; this fix migrates only `amp.initialize` and the scaler"
            )

    # ------------------------------------------------------------------ the scaler
    def _scaler_line(self, call: cst.Call) -> Tuple[cst.SimpleStatementLine, cst.Name]:
        assign = self.names.parent(call)
        line = self.names.parent(assign)
        if not (
            isinstance(assign, cst.Assign)
            and assign.value is call
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            raise Unfixable(f"`ApexScaler()` at line {self._line(call)} is not assigned to a name on a line of its own")
        if self.names.parent(line) is not self.names.parent(self.p.init_line):
            raise Unfixable(
                f"`ApexScaler()` at line {self._line(call)} is not in the block of `amp.initialize` "
                f"(line {self._line(self.p.init.call)})"
            )
        return line, assign.targets[0].target

    def _scaler_uses(self, target: cst.Name, line: cst.SimpleStatementLine) -> List[cst.Call]:
        """The calls of the scaler this file makes, following it into this file's functions;
        every other use must be one both scalers answer alike."""
        refs = self._references(target.value, self.p.home)
        calls: List[cst.Call] = []
        self._follow_scaler(refs, calls, 0)
        return calls

    def _follow_scaler(self, refs: List[cst.Name], calls: List[cst.Call], depth: int) -> None:
        for ref in refs:
            node = _value_root(self.names, ref)
            parent = self.names.parent(node)
            if isinstance(parent, cst.Call) and parent.func is node:
                calls.append(parent)
            elif isinstance(parent, cst.Comparison) and _compares_with_none(parent):
                continue
            elif isinstance(parent, (cst.If, cst.While)) and parent.test is node:
                continue
            elif isinstance(parent, (cst.BooleanOperation, cst.UnaryOperation)):
                continue  # a truth test (`if scaler and ...`, `not scaler`)
            elif isinstance(parent, cst.Attribute) and parent.value is node:
                if parent.attr.value not in ("state_dict", "load_state_dict", "state_dict_key"):
                    raise Unfixable(
                        f"`{self.ctx.code(parent).strip()}` at line {self._line(parent)} is not part of the protocol "
                        "timm's ApexScaler and NativeScaler share"
                    )
                self.checkpoints = True
            elif isinstance(parent, cst.Arg) and parent.value is node and not parent.star:
                call = self.names.parent(parent)
                if self.names.qualified_names(call.func) & TIMM_SCALER_STATE_USERS:
                    self.checkpoints = True
                    continue
                remote = remote_callee(self.p, call) if isinstance(call, cst.Call) else None
                if remote is not None:  # a function or class of another file (_timm_remote.py)
                    found = remote.scaler_uses(parent)
                    calls.extend(found.calls)
                    self.checkpoints = self.checkpoints or found.checkpoints
                    self.remotes.append(remote)
                    continue
                self._follow_scaler(self._parameter_refs(call, parent, ref, "the loss scaler", depth), calls, depth + 1)
            else:
                raise Unfixable(
                    f"the loss scaler is used at line {self._line(ref)} in a way this fix cannot follow "
                    "(ApexScaler and NativeScaler differ in what they clip)"
                )

    def _check_clip(self, call: cst.Call) -> None:
        """ApexScaler clipped `amp.master_params(optimizer)`; NativeScaler clips `parameters`
        (and asserts it is given)."""
        if isinstance(call, RemoteCall):  # judged where it was read (_timm_remote.py)
            if call.unsafe is not None:
                self.p.unsafe.append(call.unsafe)
            if call.note is not None:
                self.p._note(call.note)
            return
        positional = [a for a in call.args if a.keyword is None]
        bound = bound_arguments(call, SCALER_CALL_PARAMS)
        if bound is None or len(positional) > _SAME_POSITIONS:
            raise Unfixable(
                f"the loss scaler's call at line {self._line(call)} passes arguments by position past `clip_grad` "
                "(or with `*`/`**`); timm's versions order them differently"
            )
        clip = bound.get("clip_grad")
        if clip is None or _is_none(clip.value):
            return
        parameters = bound.get("parameters")
        if parameters is None or _is_none(parameters.value):
            raise Unfixable(
                f"the loss scaler's call at line {self._line(call)} clips without `parameters=`: timm's NativeScaler "
                "asserts it is given (ApexScaler clipped the optimizer's parameters)"
            )
        value = parameters.value
        code = " ".join(self.ctx.code(value).split())  # one line, however the call was wrapped
        head = _model_parameters(value, self.names)
        if head is not None:
            guard = agc_guard(self.p, call, clip.value, head, self.scaler_line) if head not in (False, True) else None
            if guard is not None:
                if guard not in self.guards:
                    self.guards.append(guard)
                self.p._note(
                    f"where `{code}` (line {self._line(value)}) leaves the head out (timm's `clip_mode='agc'`) and the "
                    "step clips, ApexScaler clipped every parameter of the optimizer: the apex arm now raises "
                    "ValueError for that configuration"
                )
                return
            if head is not False:
                self.p.unsafe.append(
                    f"`{code}` at line {self._line(value)}: where `exclude_head` is true (timm's `clip_mode='agc'`) "
                    "NativeScaler leaves the head's weight and bias unclipped, and ApexScaler clipped every parameter "
                    "of the optimizer"
                )
                return
            self.p._note(
                f"the clip at line {self._line(call)} now covers `{code}` where apex clipped the optimizer's parameters "
                "(the same gradients when the optimizer trains the whole model)"
            )
            return
        self.p.unsafe.append(
            f"NativeScaler clips `{code}` (line {self._line(value)}) where ApexScaler clipped every parameter of the "
            "optimizer (`amp.master_params`)"
        )

    def _respell_scaler(self, call: cst.Call, native: str) -> None:
        """`ApexScaler()` -> `NativeScaler()`, imported from where ApexScaler was."""
        func = call.func
        p = self.p
        short = native.rpartition(".")[2]
        if isinstance(func, cst.Attribute):
            p.builder.replace(func.attr, cst.Name(short))
            return
        if not isinstance(func, cst.Name):
            raise Unfixable(f"`{self.ctx.code(func)}` at line {self._line(call)} is not a name the fix can respell")
        scope = self.names.scope_of(call)
        existing = self.names.lookup(short, scope)
        bindings = self.names.bindings_of(func)
        if existing:
            if not all(b.kind == "from-import" and b.qname in TIMM_NATIVE_SCALERS for b in existing):
                raise Unfixable(f"the name `{short}` is bound to something else than timm's NativeScaler here")
            p.builder.replace(func, cst.Name(short))
            for binding in bindings:
                if all(r is func for r in self.names.references(binding)):
                    p.removal.remove_import_binding(binding)
            return
        if not bindings:  # `from timm.utils import *`: NativeScaler comes the same way
            if self.names.lookup(short, self.names.module_scope):
                raise Unfixable(f"the name `{short}` is bound to something else in this file")
            p.builder.replace(func, cst.Name(short))
            return
        if len(bindings) != 1 or bindings[0].kind != "from-import" or not isinstance(bindings[0].node, cst.ImportAlias):
            raise Unfixable(f"`{func.value}` at line {self._line(call)} is not bound by one `from timm... import`")
        binding = bindings[0]
        others = [r for r in self.names.references(binding) if r is not func]
        if others:
            raise Unfixable(
                f"`{func.value}` is used again at line {self._line(others[0])}; with its import renamed to `{short}` "
                "that use would change"
            )
        if any(self.names.lookup(short, s) for s in self.names.scopes):
            raise Unfixable(f"the name `{short}` is bound in this file already")
        alias = binding.node
        if alias.asname is not None:
            p.builder.replace(alias.name, cst.Name(short))  # `ApexScaler as AS`: AS now names NativeScaler
            return
        p.builder.replace(alias.name, cst.Name(short))
        p.builder.replace(func, cst.Name(short))

    # ------------------------------------------------------------------ the autocast variable
    def _autocast_variable(self, line: cst.SimpleStatementLine, training: Set[cst.CSTNode]) -> str:
        """The name a do-nothing context binds before the apex arm and the training code enters
        as `with X():` where it calls the loss scaler."""
        home = self.p.home
        arm = self.names.parent(line)
        found: List[str] = []
        for name, bindings in home.bindings.items():
            if not any(b.kind == "assign" and b.value is not None and self._null_context(b.value) for b in bindings):
                continue
            if any(arm in self.names.ancestors(b.node) for b in bindings):
                continue  # the apex arm binds it itself
            reaching = self._reaching_value(line, name, bindings)
            if reaching is None or not self._null_context(reaching):
                continue
            if not all(b.kind == "assign" and b.value is not None and self._context_value(b.value) for b in bindings):
                continue
            withs = self._autocast_uses(name, home)
            if withs is None:
                continue
            if any(self._function_of(w) in training for w in withs):
                found.append(name)
                self.autocast_withs = withs
        if not found:
            raise Unfixable(
                "no name bound to a do-nothing context (`suppress`/`nullcontext`) before the apex arm is entered as "
                "`with X():` where the loss scaler is called: the autocast the training code uses cannot be found"
                + (f" ({self.autocast_problem})" if self.autocast_problem else "")
            )
        if len(found) > 1:
            raise Unfixable(
                "`" + "`, `".join(sorted(found)) + "` could each be the training code's autocast: the fix cannot tell which"
            )
        name = found[0]
        if any(b.scope is not home for b in self.names.lookup(name, home)):
            raise Unfixable(f"`{name}` is not a local name of the function that calls `amp.initialize`")
        return name

    def _reaching_value(self, line: cst.CSTNode, name: str, bindings: List[Binding]) -> Optional[cst.BaseExpression]:
        """The value the nearest binding of `name` before `line` gave it, where that binding is a
        plain assignment on its own line (else None)."""
        for statement in preceding(self.names, line):
            inside = [b for b in bindings if b.statement is not None and (b.statement is statement or statement in self.names.ancestors(b.statement))]
            if not inside:
                continue
            if len(inside) == 1 and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                return inside[0].value
            return None
        return None

    def _null_context(self, value: cst.BaseExpression) -> bool:
        return bool(self.names.qualified_names(value) & NULL_CONTEXTS)

    def _context_value(self, value: cst.BaseExpression) -> bool:
        """A do-nothing context or an autocast (also `functools.partial(autocast, ...)`)."""
        if self._null_context(value) or self.names.qualified_names(value) & ANY_AUTOCAST:
            return True
        if isinstance(value, cst.Call) and "functools.partial" in self.names.qualified_names(value.func) and value.args:
            return bool(self.names.qualified_names(value.args[0].value) & ANY_AUTOCAST)
        return False

    def _autocast_uses(self, name: str, scope) -> Optional[List[cst.Call]]:
        """The `with X(...)` calls `name` reaches (through this file's calls), or None where it
        is used otherwise."""
        withs: List[cst.Call] = []
        try:
            self._follow_autocast(self._references(name, scope), withs, 0)
        except Unfixable as exc:
            self.autocast_problem = str(exc)
            return None
        return withs

    def _follow_autocast(self, refs: List[cst.Name], withs: List[cst.Call], depth: int) -> None:
        for ref in refs:
            parent = self.names.parent(ref)
            if isinstance(parent, cst.Call) and parent.func is ref:
                item = self.names.parent(parent)
                if not isinstance(item, cst.WithItem) or any(a.keyword is None for a in parent.args):
                    raise Unfixable(f"`{ref.value}` is called at line {self._line(parent)} other than as `with {ref.value}():`")
                withs.append(parent)
            elif isinstance(parent, cst.Arg) and parent.value is ref and not parent.star:
                call = self.names.parent(parent)
                remote = remote_callee(self.p, call) if isinstance(call, cst.Call) else None
                if remote is not None:  # a function of another file (_timm_remote.py)
                    withs.extend(remote.autocast_uses(parent, f"`{ref.value}`"))
                    self.remotes.append(remote)
                    continue
                self._follow_autocast(self._parameter_refs(call, parent, ref, f"`{ref.value}`", depth), withs, depth + 1)
            else:
                raise Unfixable(f"`{ref.value}` is used at line {self._line(ref)} other than as an autocast")

    # ------------------------------------------------------------------ following values
    def _references(self, name: str, scope) -> List[cst.Name]:
        refs: List[cst.Name] = []
        seen: Set[int] = set()
        for binding in scope.bindings.get(name, []):
            for ref in self.names.references(binding):
                if id(ref) not in seen:
                    seen.add(id(ref))
                    refs.append(ref)
        return refs

    def _parameter_refs(self, call: cst.Call, arg: cst.Arg, ref: cst.CSTNode, what: str, depth: int) -> List[cst.Name]:
        """The loads of the parameter of a function of this file that `arg` binds."""
        unseen = Unfixable(
            f"{what} is passed at line {self._line(call)} to `{self.ctx.code(call.func).strip()}`, which this fix cannot follow"
        )
        if depth >= _DEPTH or not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
            raise unseen
        defs = self.names.bindings_of(call.func)
        if len(defs) != 1 or defs[0].kind != "def" or not isinstance(defs[0].node, cst.FunctionDef):
            raise unseen
        function = defs[0].node
        params = function.params
        if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
            raise unseen
        if arg.keyword is not None:
            candidates = [*params.posonly_params, *params.params, *params.kwonly_params]
            param = next((q for q in candidates if q.name.value == arg.keyword.value), None)
        else:
            positional = [*params.posonly_params, *params.params]
            index = [a for a in call.args if a.keyword is None].index(arg)
            if any(a.star for a in call.args):
                raise unseen
            param = positional[index] if index < len(positional) else None
        if param is None:
            raise unseen
        scope = self.names.scope_entries.get(function.body)
        if scope is None:
            raise unseen
        bindings = scope.bindings.get(param.name.value, [])
        if len(bindings) != 1 or bindings[0].kind != "param":
            raise Unfixable(f"`{param.name.value}` of `{function.name.value}` is assigned again: {what} cannot be followed")
        return list(self.names.references(bindings[0]))

    def _function_of(self, node) -> Optional[object]:
        if isinstance(node, RemoteWith):
            return node.function
        return self.p._function_scope(node).node

    def _functions_around(self, node: cst.CSTNode) -> List[cst.CSTNode]:
        """The functions `node` is in, innermost first (timm's later train.py calls the scaler in
        a `_backward` helper nested in the function that enters the autocast)."""
        if isinstance(node, RemoteCall):
            return list(node.functions)
        return [a for a in self.names.ancestors(node) if isinstance(a, cst.FunctionDef)]

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node).start.line


def _value_root(names, ref: cst.CSTNode) -> cst.CSTNode:
    """`None if args.no_resume_opt else loss_scaler`: the conditional expression it is a branch of."""
    node = ref
    while True:
        parent = names.parent(node)
        if isinstance(parent, cst.IfExp) and parent.test is not node:
            node = parent
        else:
            return node


def _compares_with_none(comparison: cst.Comparison) -> bool:
    return len(comparison.comparisons) == 1 and isinstance(
        comparison.comparisons[0].operator, (cst.Is, cst.IsNot)
    ) and (_is_none(comparison.comparisons[0].comparator) or _is_none(comparison.left))


def _is_none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _model_parameters(value: cst.BaseExpression, names) -> Optional[object]:
    """`m.parameters()` -> False; `model_parameters(m, exclude_head=e)` -> False when `e` is
    absent or literally false, True when literally true, else `e`; None for anything else."""
    if not isinstance(value, cst.Call):
        return None
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value == "parameters" and not value.args:
        return False
    if not names.qualified_names(func) & TIMM_MODEL_PARAMETERS:
        return None
    bound: Dict[str, cst.Arg] = bound_arguments(value, ("model", "exclude_head")) or {}
    if "model" not in bound:
        return None
    head = bound.get("exclude_head")
    if head is None:
        return False
    try:
        return bool(literal_value(head.value))
    except ValueError:
        return head.value
