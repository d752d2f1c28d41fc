"""When are two loss curves the same training run? (pure Python: no torch, no numpy)

Mixed precision changes rounding, so a correct migration never reproduces the baseline bit for
bit; the question is whether its curve differs from the baseline by more than the baseline
differs from itself. The criterion (README, "Verifying a migration at run time"):

1. Every curve is smoothed with a bias-corrected exponential moving average (span `span_for`),
   so batch-to-batch noise does not count, only the trend. The first `span` steps, where the
   average has not yet seen a full window, are left out of the measures below.
2. The noise floor is the root-mean-square distance between the smoothed baseline (seed S) and
   the smoothed baseline re-run with other seeds (S+1, ..., S+K-1): how far two equally valid
   runs of the same code drift apart. It is never taken below `MIN_RELATIVE_FLOOR` of the
   baseline's median smoothed loss, so a script whose runs ignore the seed does not make every
   rounding difference fatal.
3. The after run (seed S, like the baseline) is equivalent when its largest smoothed deviation
   from the baseline stays within `FLOOR_MULTIPLE` times that floor, its final smoothed loss is
   within `tolerance` (relative) of the baseline's, and its loss stays finite.

Why 4x: on the bundled example a baseline re-run with a fresh seed deviates 2.4-3.1x the floor,
a correct bf16 migration (same seed) 0.01x, and learning rates off by a third or more 7-30x;
4x accepts what is no further from the baseline than another seed would be, and nothing that
changes the training dynamics more than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

FLOOR_MULTIPLE = 4.0
DEFAULT_TOLERANCE = 0.05
MIN_RELATIVE_FLOOR = 1e-3
MIN_STEPS = 10

Curve = Sequence[Optional[float]]


class ComparisonError(Exception):
    """The curves cannot be compared (too short, or a baseline that is not finite)."""


def span_for(steps: int) -> int:
    """EMA span: a twentieth of the run, at least 5 and at most 50 steps."""
    return max(5, min(50, steps // 20))


def ema(values: Curve, span: int) -> List[float]:
    """Bias-corrected exponential moving average; steps without a loss (None) hold the average."""
    alpha = 2.0 / (span + 1.0)
    smoothed: List[float] = []
    average = 0.0
    weight = 0.0
    for value in values:
        if value is not None:
            average = (1.0 - alpha) * average + alpha * value
            weight = (1.0 - alpha) * weight + alpha
        smoothed.append(average / weight if weight else math.nan)
    return smoothed


def first_non_finite(values: Curve) -> Optional[int]:
    for index, value in enumerate(values):
        if value is not None and not math.isfinite(value):
            return index
    return None


@dataclass
class Comparison:
    steps: int  # steps compared (the shortest run)
    span: int
    baseline: List[float]  # smoothed curves over the compared steps
    after: List[float]
    noise: List[List[float]]
    final_baseline: float
    final_after: float
    max_deviation: float
    max_deviation_step: int
    noise_floor: float
    floor_raised: bool  # the measured floor was below the minimum and was raised to it
    multiple: float
    tolerance: float
    reasons: List[str] = field(default_factory=list)  # why it is not equivalent (empty: equivalent)

    @property
    def equivalent(self) -> bool:
        return not self.reasons

    @property
    def ratio(self) -> float:
        return self.max_deviation / self.noise_floor if self.noise_floor > 0 else math.inf

    @property
    def final_difference(self) -> float:
        """Relative difference of the final smoothed losses (after vs. baseline)."""
        if self.final_baseline == 0:
            return 0.0 if self.final_after == 0 else math.inf
        return (self.final_after - self.final_baseline) / abs(self.final_baseline)


def compare(
    baseline: Curve,
    after: Curve,
    noise: Sequence[Curve],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    multiple: float = FLOOR_MULTIPLE,
) -> Comparison:
    """Compare the after curve with the baseline, against the baseline's own seed-to-seed noise."""
    if not noise:
        raise ComparisonError("the noise floor needs at least one more baseline run (--runs 2 or more)")
    for label, curve in [("baseline", baseline), *[(f"baseline seed run {i + 1}", c) for i, c in enumerate(noise)]]:
        bad = first_non_finite(curve)
        if bad is not None:
            raise ComparisonError(f"the {label} loss is not finite at step {bad + 1}; the baseline itself is unstable")
    steps = min(len(baseline), len(after), *(len(c) for c in noise))
    if steps < MIN_STEPS:
        raise ComparisonError(f"only {steps} optimizer steps ran in every run; at least {MIN_STEPS} are needed to compare")
    reasons: List[str] = []
    if len(after) != len(baseline):
        reasons.append(f"the runs made different numbers of optimizer steps ({len(baseline)} before, {len(after)} after)")
    span = span_for(steps)
    smooth_baseline = ema(baseline[:steps], span)
    smooth_noise = [ema(curve[:steps], span) for curve in noise]
    if any(math.isnan(v) for v in smooth_baseline) or all(v is None for v in after[:steps]):
        raise ComparisonError("a run recorded no loss in its first steps")

    # Until the average has seen a full window its first values are single noisy batches; the
    # deviation and the floor are measured from there on (non-finite losses are caught anyway).
    start = min(span, steps // 2)
    squares = [(n[t] - smooth_baseline[t]) ** 2 for n in smooth_noise for t in range(start, steps) if not math.isnan(n[t])]
    measured = math.sqrt(sum(squares) / len(squares)) if squares else 0.0
    scale = sorted(abs(v) for v in smooth_baseline)[steps // 2]
    minimum = MIN_RELATIVE_FLOOR * scale
    floor = max(measured, minimum)

    bad = first_non_finite(after[:steps])
    if bad is not None:
        reasons.append(f"the after loss is not finite from step {bad + 1}")
        smooth_after = ema([v if v is None or math.isfinite(v) else None for v in after[:steps]], span)
        deviations = [math.inf]
        worst = bad
    else:
        smooth_after = ema(after[:steps], span)
        deviations = [abs(a - b) if not math.isnan(a) else 0.0 for a, b in zip(smooth_after, smooth_baseline)]
        worst = max(range(start, steps), key=deviations.__getitem__)
        deviations = deviations[start:]
    result = Comparison(
        steps=steps,
        span=span,
        baseline=smooth_baseline,
        after=smooth_after,
        noise=smooth_noise,
        final_baseline=smooth_baseline[-1],
        final_after=smooth_after[-1],
        max_deviation=max(deviations),
        max_deviation_step=worst + 1,
        noise_floor=floor,
        floor_raised=measured < minimum,
        multiple=multiple,
        tolerance=tolerance,
        reasons=reasons,
    )
    if bad is None:
        if result.max_deviation > multiple * floor:
            reasons.append(
                f"the smoothed loss deviates by {result.max_deviation:.4g} at step {result.max_deviation_step}, "
                f"{result.ratio:.1f}x the noise floor (limit {multiple:g}x)"
            )
        if abs(result.final_difference) > tolerance:
            reasons.append(
                f"the final smoothed loss differs by {result.final_difference:+.1%} (tolerance {tolerance:.1%})"
            )
    return result
