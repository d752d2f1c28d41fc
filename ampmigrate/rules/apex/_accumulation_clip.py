"""A clip on every micro-step of gradient accumulation, kept exact with GradScaler.

apex (O1/O2, no `delay_unscale`) unscales the gradients at the exit of every
`with amp.scale_loss(...)`, so a clip after each backward, while the optimizer steps only every
N micro-steps (`if (step + 1) % N == 0: optimizer.step()`), clips the unscaled partial sums.
GradScaler keeps the gradients multiplied by the scale S until `unscale_`/`step`, and
`unscale_` may run only once per step, so no `unscale_` can go before such a clip. But S does
not change inside an accumulation window (only `scaler.update()` changes it), and clipping is
homogeneous:

    clip_grad_norm_(S * g, S * M)  == S * clip_grad_norm_(g, M)   (up to its 1e-6 eps)
    clip_grad_value_(S * g, S * v) == S * clip_grad_value_(g, v)

so the clip stays where it is with its threshold multiplied by `scaler.get_scale()` (1.0 for a
disabled scaler), and a norm it returns is divided by it. On inf/NaN gradients the clip yields
non-finite gradients and `scaler.step` skips the step, as apex skipped it.

Only torch's own `clip_grad_norm_`/`clip_grad_value_` (resolved by qualified name) qualify, and
a gradient-norm helper of the program that engine/grad_norm_helpers.py recognizes by its structure
(`grad_norm = get_grad_norm(amp.master_params(opt))` in Swin-Transformer): a p-norm scales with
the gradients, so its value divided by `scaler.get_scale()` is apex's. Any other read of the
gradients on a micro-step (another helper, an all-reduce) stays a refusal that says so.

A mixin of the planner (`_amp_migration._Planner`), called from `_amp_steps._plan_unscale`.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import is_pure
from ampmigrate.engine.grad_norm_helpers import grad_norm_call_ok, grad_norm_helpers
from ampmigrate.rules.apex._amp_common import Step, Unfixable
from ampmigrate.rules.grad_scaler.amp301_clip_without_unscale import (
    _contains,
    _result_used_only_inside,
    _touches_gradients,
)

_NORM = "norm"
_VALUE = "value"
# torch's clips, by qualified name -> (kind, name of the threshold parameter).
TORCH_CLIPS: Dict[str, Tuple[str, str]] = {
    "torch.nn.utils.clip_grad_norm_": (_NORM, "max_norm"),
    "torch.nn.utils.clip_grad_norm": (_NORM, "max_norm"),
    "torch.nn.utils.clip_grad.clip_grad_norm_": (_NORM, "max_norm"),
    "torch.nn.utils.clip_grad.clip_grad_norm": (_NORM, "max_norm"),
    "torch.nn.utils.clip_grad_value_": (_VALUE, "clip_value"),
    "torch.nn.utils.clip_grad.clip_grad_value_": (_VALUE, "clip_value"),
}
_PARAMETERS = {_NORM: ("parameters", "max_norm", "norm_type", "error_if_nonfinite", "foreach"), _VALUE: ("parameters", "clip_value", "foreach")}
# Where `clip(...) / scale` needs no parentheses.
_BARE_CONTEXTS = (cst.Assign, cst.AnnAssign, cst.Arg, cst.Return, cst.AugAssign)


class ClipMoves:
    """The unsafe alternative (only with `--unsafe-fixes`): the form maintainers write, the clip
    once per step inside the stepping branch after `scaler.unscale_(optimizer)`, as AMP301's
    `accumulation_move` writes it for GradScaler code (whose shape tests this reuses). It clips
    the summed gradients once instead of each micro-step's partial sum: other numerics."""

    def _moves(self, step: Step, clips: List[cst.Call]):
        """(the stepping `if`, [(the statement that goes, the clip statement to insert)], the
        conditions the clips ran under below that `if`'s block), or None where some clip of the
        step cannot move."""
        branch: Optional[cst.If] = None
        conditions: Optional[List[str]] = None
        moves = []
        for clip in clips:
            statement = self.names.statement_of(clip)
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                return None
            small = statement.body[0]
            if not (isinstance(small, (cst.Expr, cst.Assign)) and small.value is clip):
                return None  # `log(clip(...))`: moving it would also change what else runs per micro-step
            found = self._stepping_branch(statement, step)
            if found is None:
                return None
            here, removed, these = found
            if (branch is not None and here is not branch) or (conditions is not None and these != conditions):
                return None
            branch, conditions = here, these
            if not _result_used_only_inside(self.names, statement, branch.body):
                return None
            moves.append((removed, statement))
        return branch, moves, conditions or []

    def _stepping_branch(self, statement: cst.SimpleStatementLine, step: Step):
        """The `if` after `statement` (in its block, or in the block of the `if`s whose body holds
        it) that runs every optimizer step of `step`, with nothing in between that touches the
        gradients: (that `if`, what to remove: the statement or an `if` holding only it, the
        tests of the `if`s climbed, outermost first)."""
        node: cst.CSTNode = statement
        removed: cst.CSTNode = statement
        conditions: List[str] = []
        while True:
            block = self.names.parent(node)
            if not isinstance(block, cst.IndentedBlock):
                return None
            siblings = list(block.body)
            later = siblings[siblings.index(node) + 1 :]
            branch = next(
                (s for s in later if isinstance(s, cst.If) and all(_contains(self.names, s.body, c) for c in step.steps)),
                None,
            )
            between = later[: later.index(branch)] if branch is not None else later
            if any(_touches_gradients(self.names, s) for s in between):
                return None
            if branch is not None:
                return branch, removed, conditions
            owner = self.names.parent(block)
            if not isinstance(owner, cst.If) or owner.body is not block or not is_pure(owner.test):
                return None
            test = self.ctx.code(owner.test).strip()
            if isinstance(owner.test, cst.BooleanOperation) and isinstance(owner.test.operator, cst.Or):
                test = f"({test})"  # joined with `and` below
            conditions.insert(0, test)
            if removed is node and len(siblings) == 1 and owner.orelse is None:
                removed = owner  # `if clip_grad: clip(...)` goes whole
            node = owner

    def _move_clips(self, step: Step, clips: List[cst.Call], moves) -> None:
        branch, pairs, conditions = moves
        scaler = self.access.expression(branch)
        first = next(s for s in branch.body.body if any(_contains(self.names, s, c) for c in step.steps))
        new: List[cst.BaseStatement] = []
        for optimizer in dict.fromkeys(self.ctx.code(o).strip() for o in step.optimizers):
            new.append(self.ctx.parse_statement(self._unscale_code(scaler, optimizer) + "\n"))
        moved_refs = []
        for removed, statement in pairs:
            copy = statement
            for ref in self.refs:
                if ref.api == "master_params" and ref.call is not None and _contains(self.names, statement, ref.call):
                    copy = copy.deep_replace(ref.call, self._master_params_expression(ref))
                    moved_refs.append(ref)
            new.append(copy.with_changes(leading_lines=[line for line in statement.leading_lines if line.comment is not None]))
            self.removal.remove_statement(removed)
            self.handled.add(removed)
        self.refs = [r for r in self.refs if r not in moved_refs]
        if conditions:
            test = " and ".join(conditions)
            header = self.ctx.parse_statement(f"if {test}:\n    pass\n")
            new = [header.with_changes(body=header.body.with_changes(body=new))]
        self.builder.insert_before(first, *new)
        lines = ", ".join(str(self._line(c)) for c in clips)
        self.unsafe.append(
            f"the clip at line {lines} moves into the stepping branch after `{scaler}.unscale_(...)`: clipping moves "
            "from every micro-step to once per step on the summed gradients, which changes numerics"
        )


class AccumulationClips(ClipMoves):
    def _scaled_on_micro_steps(self, reader: cst.CSTNode, point: cst.CSTNode, step: Step, master_refs) -> bool:
        """True when the gradient read `reader` runs more often than the optimizer steps and is
        a torch clip, planned here with a scaled threshold (no `unscale_` for it). False when it
        runs once per step (the caller inserts `unscale_`). Unfixable for any other read that
        runs on every micro-step."""
        try:
            self._check_once_per_step(point, step)
            return False
        except Unfixable as refusal:
            clip = self._torch_clip(reader, master_refs)
            if clip is None:
                norm = self._grad_norm_call(reader, master_refs)
                if norm is not None:  # a gradient-norm helper of the program: its value divided by the scale
                    norms = self._micro_step_norms
                    if not any(norm in calls for calls in norms.values()):
                        norms.setdefault(step, []).append(norm)
                    return True
                outer = self._outer_call(reader, master_refs)
                if reader in getattr(self, "_opaque_readers", ()):
                    raise Unfixable(
                        f"{refusal}. `{self.ctx.code(reader.func).strip()}(...)` runs code of another file or a library that may read or change them, handed "
                        "the model or the optimizer (or an object made from them): the gradients it may read or change "
                        "there are still multiplied by the loss scale"
                    ) from None
                raise Unfixable(
                    f"{refusal}. `{self.ctx.code(outer.func).strip()}(...)` is not torch's `clip_grad_norm_`/"
                    "`clip_grad_value_` (those stay exact on every micro-step with their threshold multiplied by "
                    "`scaler.get_scale()`) nor a helper recognized as a p-norm of the gradients (whose value is divided "
                    "by it), so what it reads there would be multiplied by the loss scale"
                ) from None
            self._bound_clip(clip)  # refuses what cannot be kept exact
            if not any(clip in clips for clips in self._micro_step_clips.values()):
                self._micro_step_clips.setdefault(step, []).append(clip)
            return True

    def _plan_micro_step_clips(self, inserts) -> None:
        """The clips `_scaled_on_micro_steps` collected, per step: with `--unsafe-fixes`, moved
        into the stepping branch after `unscale_` where the code has that shape; otherwise (and
        where it has not) kept in place with a scaled threshold. A step whose gradients are also
        read once per step elsewhere (an `unscale_` planned for it) is refused, rather than
        reasoning about which of the two runs first."""
        for point, items in inserts.items():
            for _, step in items:
                clips = self._micro_step_clips.get(step) or self._micro_step_norms.get(step)
                if clips:
                    raise Unfixable(
                        f"the gradients are clipped on every micro-step (line {self._line(clips[0])}) and read "
                        f"again at line {self._line(point)}, where `unscale_` would have to run once per step: "
                        "migrate this accumulation by hand"
                    )
        norms = self._micro_step_norms
        for step, clips in self._micro_step_clips.items():
            # A norm helper on the micro-steps reads the gradients the clip leaves: the clip stays.
            moves = self._moves(step, clips) if self.ctx.settings.unsafe_fixes and step not in norms else None
            if moves is not None:
                self._move_clips(step, clips, moves)
                continue
            for clip in clips:
                self._scale_threshold(clip)
        for calls in norms.values():
            for call in calls:
                self._divide_norm(call)

    # ---- the clip
    def _outer_call(self, reader: cst.CSTNode, master_refs) -> cst.Call:
        """The call that reads the gradients: `f(amp.master_params(opt))` -> `f(...)`."""
        if reader in master_refs:
            arg = self.names.parent(reader)
            call = self.names.parent(arg) if isinstance(arg, cst.Arg) else None
            if isinstance(call, cst.Call):
                return call
        return reader

    def _torch_clip(self, reader: cst.CSTNode, master_refs) -> Optional[cst.Call]:
        call = self._outer_call(reader, master_refs)
        if not isinstance(call, cst.Call) or _clip_kind(self.names, call) is None:
            return None
        if reader is not call and (not call.args or call.args[0].value is not reader):
            return None  # `amp.master_params(opt)` is not the clip's parameters
        return call

    # ---- a gradient-norm helper of the program (engine/grad_norm_helpers.py)
    def _grad_norm_call(self, reader: cst.CSTNode, master_refs) -> Optional[cst.Call]:
        """`f(amp.master_params(opt))` whose value is used, with `f` a recognized gradient-norm
        helper: defined at the top of this file, or imported by name from a file of the run whose
        index summary records it. None for anything else (the read stays refused)."""
        if reader not in master_refs:
            return None
        call = self._outer_call(reader, master_refs)
        if call is reader or not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
            return None
        first = call.args[0] if call.args else None
        if first is None or first.value is not reader or first.keyword is not None or first.star:
            return None
        if isinstance(self.names.parent(call), cst.Expr):
            return None  # its value is discarded: nothing to divide (and nothing apex-specific to keep)
        record = self._grad_norm_record(call.func)
        if record is None:
            return None
        args = []
        for arg in call.args:
            value = None
            if not arg.star:
                try:
                    value = ast.parse(self.ctx.code(arg.value).strip(), mode="eval").body
                except (SyntaxError, ValueError, RecursionError):
                    value = None
            args.append((arg.keyword.value if arg.keyword is not None else None, value))
        return call if grad_norm_call_ok(record, args) else None

    def _grad_norm_record(self, func: cst.Name):
        bindings = self.names.bindings_of(func)
        if len(bindings) != 1:
            return None
        binding = bindings[0]
        if binding.kind == "def" and binding.scope.kind == "module":
            helpers = self.__dict__.get("_file_grad_norm_helpers")
            if helpers is None:
                try:
                    helpers = grad_norm_helpers(ast.parse(self.module.code))
                except (SyntaxError, ValueError, RecursionError, MemoryError):
                    helpers = {}
                self._file_grad_norm_helpers = helpers
            return helpers.get(func.value)
        index = self.ctx.project_index
        if binding.kind != "from-import" or index is None:
            return None
        qnames = self.names.qualified_names(func)
        if len(qnames) != 1:
            return None
        found = index.grad_norm_helper(next(iter(qnames)), self.ctx.path)
        return found[1] if found is not None else None

    def _divide_norm(self, call: cst.Call) -> None:
        statement = self.names.statement_of(call)
        scaler = self.access.expression(statement)
        self._divide_by_scale(call, scaler)
        self._note(
            f"`{self.ctx.code(call.func).strip()}(...)` at line {self._line(call)} computes a norm of the gradients on "
            f"every micro-step while the optimizer steps every few: GradScaler keeps them scaled until the step, so "
            f"its value is divided by `{scaler}.get_scale()` (a p-norm scales with the gradients: apex's value)"
        )

    def _divide_by_scale(self, call: cst.Call, scaler: str) -> None:
        """`call` -> `call / scaler.get_scale()` (parenthesized where the context needs it)."""
        divisor = self.ctx.parse_expression(f"{scaler}.get_scale()")
        bare = isinstance(self.names.parent(call), _BARE_CONTEXTS)

        def divided(updated: cst.Call, divisor=divisor, bare=bare) -> cst.BaseExpression:
            new = cst.BinaryOperation(updated, cst.Divide(), divisor)
            if not bare:
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return new

        self.builder.replace(call, divided)

    def _bound_clip(self, clip: cst.Call) -> cst.Arg:
        """The clip's threshold argument; Unfixable where scaling it would not keep apex's clip."""
        kind, threshold_name = _clip_kind(self.names, clip)
        params = _PARAMETERS[kind]
        bound: Dict[str, cst.Arg] = {}
        for index, arg in enumerate(clip.args):
            if arg.star:
                raise Unfixable(f"the clip at line {self._line(clip)} passes its arguments with `*`/`**`")
            name = arg.keyword.value if arg.keyword is not None else (params[index] if index < len(params) else None)
            if name not in params or name in bound:
                raise Unfixable(f"the clip at line {self._line(clip)} has arguments torch's signature does not match")
            bound[name] = arg
        threshold = bound.get(threshold_name)
        if threshold is None:
            raise Unfixable(f"the clip at line {self._line(clip)} has no `{threshold_name}`")
        norm_type = bound.get("norm_type")
        if norm_type is not None and not _homogeneous_norm(norm_type.value):
            raise Unfixable(
                f"the clip at line {self._line(clip)} runs on every micro-step with `norm_type="
                f"{self.ctx.code(norm_type.value).strip()}`, which may not be a norm that scales with the gradients"
            )
        return threshold

    def _scale_threshold(self, clip: cst.Call) -> None:
        kind, _ = _clip_kind(self.names, clip)
        threshold = self._bound_clip(clip)
        statement = self.names.statement_of(clip)
        scaler = self.access.expression(statement)
        value = threshold.value
        code = self.ctx.code(value).strip()
        if not _atomic(value):
            code = f"({code})"
        self.builder.replace(value, self.ctx.parse_expression(f"{code} * {scaler}.get_scale()"))
        self.handled.add(value)
        if kind == _NORM and not isinstance(self.names.parent(clip), cst.Expr):
            self._divide_by_scale(clip, scaler)
        self._note(
            f"the clip at line {self._line(clip)} runs on every micro-step while the optimizer steps every few: "
            f"GradScaler keeps the gradients scaled until the step, so its threshold is multiplied by "
            f"`{scaler}.get_scale()`"
            + (" and the norm it returns divided by it" if kind == _NORM and not isinstance(self.names.parent(clip), cst.Expr) else "")
            + " (exactly apex's clipping)"
        )


def _clip_kind(names, call: cst.Call) -> Optional[Tuple[str, str]]:
    for qname in names.qualified_names(call.func):
        if qname in TORCH_CLIPS:
            return TORCH_CLIPS[qname]
    return None


def _atomic(node: cst.BaseExpression) -> bool:
    if node.lpar:
        return True
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float))


def _homogeneous_norm(node: cst.BaseExpression) -> bool:
    """A p-norm with p > 0 (or inf) written as a literal: scales linearly with the gradients."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.value.replace("_", "")) > 0
    if isinstance(node, cst.SimpleString):
        return False
    code = cst.Module([]).code_for_node(node)
    return code in ("float('inf')", 'float("inf")', "math.inf", "torch.inf", "inf", "numpy.inf", "np.inf")

