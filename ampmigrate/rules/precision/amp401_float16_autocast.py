"""AMP401: autocast in float16 (explicitly, or by the CUDA default) -> `dtype=torch.bfloat16`."""

from __future__ import annotations

from typing import Dict, List, Tuple

import libcst as cst

from ampmigrate.analysis.autocasts import Autocast, autocast_dtype_is_changed, autocasts, bf16_spelling
from ampmigrate.analysis.scalers import find_scalers
from ampmigrate.analysis.values import Source
from ampmigrate.api import format_version
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.context import rebuild_args
from ampmigrate.rules.base import Rule
from ampmigrate.rules.precision._bf16_hazards import bf16_hazards
from ampmigrate.rules.precision._common import (
    AMPERE,
    in_bf16_choice,
    in_inference_code,
    is_training_file,
    line_of,
    recommends_bf16_at,
    trained_elsewhere,
    trainer_scales_loss,
)
from ampmigrate.rules.precision._scaler_removal import scalers_that_stay
from ampmigrate.api import ANY_AUTOCAST

BF16_AUTOCAST = (1, 10)  # `dtype=` of torch.autocast / torch.cuda.amp.autocast
_NO_SPACE = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


# GPUs before Ampere (V100, T4) have no fast bfloat16: say how such a fleet keeps float16.
KEEP_FLOAT16 = '; V100/T4 fleets (no fast bfloat16) keep float16 with `target-dtype = "float16"` in the configuration'


class Float16Autocast(Rule):
    code = "AMP401"
    triggers = (r"autocast",)
    qualified_prefixes = tuple(sorted(ANY_AUTOCAST))

    def applies_to(self, path, settings) -> bool:
        return recommends_bf16_at(path, settings)

    def check(self, ctx) -> None:
        if not self.applies_to(ctx.path, ctx.settings):
            return
        trains_here = is_training_file(ctx.file)
        shared_fixes: Dict[Tuple[int, ...], Fix] = {}
        scaler_note = " (a GradScaler is then unnecessary: AMP402)" if find_scalers(ctx.file) else ""
        for autocast in autocasts(ctx.file):
            if autocast.opaque or autocast.disabled or autocast.call is None or in_bf16_choice(ctx, autocast.call):
                continue
            if in_inference_code(ctx.file, autocast.call):
                continue
            note = scaler_note
            half_migration = lambda: _scaler_stays_here(ctx)  # noqa: E731
            if not trains_here:
                # A module that trains nothing itself: is what holds the autocast trained elsewhere?
                trainer = trained_elsewhere(ctx.file, autocast.call)
                if trainer is None:
                    continue
                note = f" (its backward runs in {trainer})"
                if trainer_scales_loss(ctx.file, autocast.call):
                    half_migration = lambda: _scaler_stays_there(trainer)  # noqa: E731
            if autocast.dtype is None:
                self._implicit(ctx, autocast, note, half_migration)
            else:
                self._explicit(ctx, autocast, note, shared_fixes, half_migration)

    # ------------------------------------------------------------------ no dtype: the CUDA default
    def _implicit(self, ctx, autocast: Autocast, scaler_note: str, half_migration) -> None:
        if autocast.devices is None or "cuda" not in autocast.devices or autocast_dtype_is_changed(ctx.file):
            return
        message = (
            f"`{ctx.code(autocast.ref)}(...)` without a dtype runs in float16 on CUDA, which needs loss "
            f"scaling and can overflow; on {AMPERE} bfloat16 has float32's range at the same speed{scaler_note}"
            f"{KEEP_FLOAT16}"
        )
        if ctx.settings.min_torch < BF16_AUTOCAST:
            ctx.report(autocast.ref, message, no_fix_reason=_too_old(ctx))
            return
        if autocast.parameter is not None:
            reason = (
                f"`{autocast.parameter}` is `torch.{autocast.legacy.device}.amp.autocast` handed in by a caller, and other "
                "context managers on other runs (`contextlib.suppress`): choose bfloat16 where the caller binds it"
            )
            ctx.report(autocast.ref, message, no_fix_reason=reason)
            return
        hazards = bf16_hazards(ctx)
        hazard = hazards.reason or half_migration()
        if hazard is not None:
            ctx.report(autocast.ref, message, no_fix_reason=hazard)
            return
        torch_name, needs_import = ctx.module_reference(autocast.call, "torch")
        if torch_name is None:
            ctx.report(autocast.ref, message, no_fix_reason="the name `torch` is taken here")
            return
        call = autocast.call
        dtype = cst.Arg(ctx.parse_expression(f"{torch_name}.bfloat16"), keyword=cst.Name("dtype"), equal=_NO_SPACE)
        args = list(call.args)
        args.insert(_dtype_position(call, autocast), dtype)
        fix = ctx.fix("Pass `dtype=torch.bfloat16`")
        if needs_import:
            fix.require_import("torch")
        fix.replace(call, rebuild_args(call, args))
        _casting(hazards, fix)
        ctx.report(autocast.ref, message, fix=fix.build())

    # ------------------------------------------------------------------ an explicit dtype
    def _explicit(self, ctx, autocast: Autocast, scaler_note: str, shared_fixes, half_migration) -> None:
        followed = autocast.dtype
        dtypes = autocast.dtypes(ctx.file)
        if dtypes is None or "float16" not in dtypes or "bfloat16" in dtypes:
            return  # unknown, not float16, or already chosen between bf16 and fp16 at run time
        if autocast.devices is not None and "cuda" not in autocast.devices:
            return  # CPU / MPS / XPU float16 is a deliberate choice this rule knows nothing about
        fp16_sources = [s for s in followed.sources if s.value == "float16"]
        if any(s.node is not None and in_bf16_choice(ctx, s.node) for s in fp16_sources):
            return  # `if torch.cuda.is_bf16_supported(): ... else: dtype = torch.float16`
        where = _where(ctx, fp16_sources)
        message = (
            f"autocast runs in float16{where}, which needs loss scaling and can overflow; on {AMPERE} "
            f"bfloat16 has float32's range at the same speed{scaler_note}{KEEP_FLOAT16}"
        )
        reason = followed.blocker or next((s.no_bf16 for s in fp16_sources if s.no_bf16), None)
        if ctx.settings.min_torch < BF16_AUTOCAST:
            reason = _too_old(ctx)
        hazards = bf16_hazards(ctx)
        reason = reason or _shared_with_other_device(ctx, autocast, fp16_sources) or hazards.reason or half_migration()
        edits: List[Tuple[cst.CSTNode, cst.BaseExpression]] = []
        imports = False
        for source in fp16_sources:
            if reason is not None:
                break
            new, needs_import = bf16_spelling(ctx.file, source)
            if new is None:
                reason = f"the float16 value{_via(source)} cannot be respelled in place"
                break
            edits.append((source.node, new))
            imports = imports or needs_import
        if reason is not None:
            ctx.report(autocast.dtype_arg.value, message, no_fix_reason=reason)
            return
        key = tuple(id(node) for node, _ in edits)
        fix = shared_fixes.get(key)
        if fix is None:
            builder = ctx.fix(_fix_message(ctx, fp16_sources))
            for node, new in edits:
                builder.replace(node, new)
            if imports:
                builder.require_import("torch")
            _casting(hazards, builder)
            fix = shared_fixes[key] = builder.build()
        ctx.report(autocast.dtype_arg.value, message, fix=fix)


def _scaler_stays_here(ctx) -> str:
    """Issue 16: bfloat16 autocast and the scaler's removal go together, or neither happens. A
    scaler made here that AMP402 cannot remove is disabled by AMP402 once every autocast of the
    file runs in bfloat16; one that comes from elsewhere, or guards a step, blocks the fix."""
    staying = scalers_that_stay(ctx.file)
    if staying.reason is None or staying.disable is not None:
        return None
    return (
        f"{staying.reason}: bfloat16 autocast beside a float16 loss scaler is half a migration; move both "
        "by hand (bfloat16 and no scaler), or keep float16"
    )


def _shared_with_other_device(ctx, autocast: Autocast, fp16_sources: List[Source]) -> str:
    """The float16 value is also the dtype of an autocast for another device (npu, xla, mps, cpu):
    that one stays as it was, so the shared value cannot change (issue 16)."""
    mine = {id(s.node) for s in fp16_sources if s.node is not None}
    for other in autocasts(ctx.file):
        if other is autocast or other.dtype is None or other.call is None:
            continue
        if other.devices is None or "cuda" in other.devices:
            continue
        if any(id(s.node) in mine for s in other.dtype.sources if s.node is not None):
            device = "/".join(sorted(other.devices))
            return (
                f"the float16 value is also the dtype of the {device} autocast at line {line_of(ctx, other.call)}, "
                "which stays as it was: give the CUDA autocast its own dtype to move it alone"
            )
    return None


def _casting(hazards, builder) -> None:
    """Cast the input of this file's real-input FFT ops to float32 (no bfloat16 FFT kernel)."""
    for node, new in hazards.casts:
        builder.replace(node, new)
    if hazards.casts:
        builder.message += hazards.note()


def _scaler_stays_there(trainer: str) -> str:
    return (
        f"its backward runs in {trainer} with a GradScaler, which this fix cannot remove there: bfloat16 "
        "autocast beside a float16 loss scaler is half a migration; move both by hand, or keep float16"
    )


def _too_old(ctx) -> str:
    return (
        f"autocast takes a dtype (and runs bfloat16 on CUDA) from torch {format_version(BF16_AUTOCAST)}; "
        f"min-torch is {format_version(ctx.settings.min_torch)}"
    )


def _dtype_position(call: cst.Call, autocast: Autocast) -> int:
    """Right after the device (modern) or after the positional arguments (legacy)."""
    for index, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == "device_type":
            return index + 1
    positional = sum(1 for a in call.args if a.keyword is None)
    if autocast.legacy is None:
        return min(1, positional)
    return positional


def _via(source: Source) -> str:
    return f" set through {source.via}" if source.via else ""


def _where(ctx, sources: List[Source]) -> str:
    placed = [s for s in sources if s.via and s.node is not None]
    if not placed:
        return ""
    first = placed[0]
    return f" (set through {first.via} at line {line_of(ctx, first.node)})"


def _fix_message(ctx, sources: List[Source]) -> str:
    first = sources[0]
    if first.via.startswith("option"):
        return f"Make `bfloat16` the default of {first.via} ({first.bf16!r})"
    if first.via:
        return f"Set {first.via} to bfloat16"
    return "Use `torch.bfloat16`"
