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

Only torch's own `clip_grad_norm_`/`clip_grad_value_` (resolved by qualified name) qualify; any
other read of the gradients on a micro-step (a helper of the program, an all-reduce) stays a
refusal that says so.

A mixin of the planner (`_amp_migration._Planner`), called from `_amp_steps._plan_unscale`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.rules.apex._amp_common import Step, Unfixable

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


class AccumulationClips:
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
                outer = self._outer_call(reader, master_refs)
                raise Unfixable(
                    f"{refusal}. `{self.ctx.code(outer.func).strip()}(...)` is not torch's `clip_grad_norm_`/"
                    "`clip_grad_value_` (those stay exact on every micro-step with their threshold multiplied by "
                    "`scaler.get_scale()`), so what it reads there would be multiplied by the loss scale"
                ) from None
            self._scale_threshold(clip, step)
            return True

    def _check_scaled_clips_alone(self, inserts) -> None:
        """A step whose gradients are clipped on every micro-step (scaled threshold) and also
        unscaled once per step for another read: refused, rather than reasoning about which of
        the two runs first."""
        scaled = getattr(self, "_micro_step_clips", {})
        for point, items in inserts.items():
            for _, step in items:
                clips = scaled.get(id(step))
                if clips:
                    raise Unfixable(
                        f"the gradients are clipped on every micro-step (line {self._line(clips[0])}) and read "
                        f"again at line {self._line(point)}, where `unscale_` would have to run once per step: "
                        "migrate this accumulation by hand"
                    )

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

    def _scale_threshold(self, clip: cst.Call, step: Step) -> None:
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
        statement = self.names.statement_of(clip)
        scaler = self.access.expression(statement)
        value = threshold.value
        code = self.ctx.code(value).strip()
        if not _atomic(value):
            code = f"({code})"
        self.builder.replace(value, self.ctx.parse_expression(f"{code} * {scaler}.get_scale()"))
        self.handled.add(value)
        if kind == _NORM and not isinstance(self.names.parent(clip), cst.Expr):
            divisor = self.ctx.parse_expression(f"{scaler}.get_scale()")
            bare = isinstance(self.names.parent(clip), _BARE_CONTEXTS)

            def divided(updated: cst.Call, divisor=divisor, bare=bare) -> cst.BaseExpression:
                new = cst.BinaryOperation(updated, cst.Divide(), divisor)
                if not bare:
                    new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                return new

            self.builder.replace(clip, divided)
        if not hasattr(self, "_micro_step_clips"):
            self._micro_step_clips: Dict[int, List[cst.Call]] = {}
        self._micro_step_clips.setdefault(id(step), []).append(clip)
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
