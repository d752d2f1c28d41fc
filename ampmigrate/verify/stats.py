"""When are two sets of training runs the same training? (pure Python: no torch, no numpy)

`verify` runs the before and the after K times each, run k of both sides with seed S+k (paired
by seed), and decides with one function, `compare`, whose error rates were measured by
`bench/verify_calibration.py` on synthetic training runs (README, "Equivalence is statistical"):

1. Smoothing: each run's loss curve is cut into `segments` equal stretches of steps and each
   stretch is replaced by its mean loss. A stretch is a fixed fraction of the run whatever its length,
   so the test asks the same number of questions of a 200-step and a 10,000-step run (a maximum
   over more and more points would reject valid runs more often the longer they ran).
2. Seed-to-seed spread: in every stretch, the standard deviation of the stretch means across
   seeds, pooled over both sides and over the neighbouring stretches: how far equally valid runs
   drift apart there. Never below `MIN_RELATIVE_SPREAD` of the loss, so a script whose runs ignore
   the seed does not make every rounding difference fatal.
3. Curve criterion: in every stretch the after runs' mean stays within `band` standard errors
   of the paired difference (spread x sqrt(2/K)) of the before runs' mean, and the root mean
   square of those ratios over the run within `rms_band` (a change of the training dynamics,
   such as another learning rate, moves many stretches a little; a bad stretch fails `band`).
4. Final loss, two one-sided tests (TOST): the paired differences of the last stretch's mean
   (after minus before, seed by seed) have a 90% confidence interval (Student t, K-1 degrees of
   freedom) inside +-margin, where margin is the larger of `margin` x the before's final loss and
   `spread_margin` x the final stretch's seed-to-seed spread.
5. A loss that stops being finite, or runs that made different numbers of steps, are not
   equivalent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

Curve = Sequence[Optional[float]]

SEGMENTS = 20
MIN_STEPS = 20  # two steps per stretch at least
MIN_RELATIVE_SPREAD = 1e-3

# One-sided 95% quantiles of Student's t by degrees of freedom (the TOST's 90% interval).
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}


def t95(df: int) -> float:
    if df in _T95:
        return _T95[df]
    below = max(d for d in _T95 if d <= df) if df < 30 else 30
    return _T95[below] if df < 30 else 1.645 + (1.697 - 1.645) * 30 / df


@dataclass(frozen=True)
class Criterion:
    """The decision's constants; the defaults are the calibrated ones (bench/verify_calibration.py)."""

    runs: int = 4  # K runs per side
    segments: int = 20  # stretches of the run, each smoothed to its mean
    band: float = 4.3  # curve: |mean paired difference| <= band x spread x sqrt(2/K) in every stretch
    rms_band: float = 1.7  # ... and their root mean square over the stretches <= this
    margin: float = 0.02  # TOST margin, relative to the before's final loss ...
    spread_margin: float = 3.8  # ... or this many seed-to-seed spreads, whichever is larger


DEFAULT = Criterion()
DEFAULT_TOLERANCE = DEFAULT.margin


class ComparisonError(Exception):
    """The runs cannot be compared (too short, or a before that is not finite)."""


def first_non_finite(values: Curve) -> Optional[int]:
    for index, value in enumerate(values):
        if value is not None and not math.isfinite(value):
            return index
    return None


def segment_bounds(steps: int, segments: int = SEGMENTS) -> List[Tuple[int, int]]:
    edges = [round(i * steps / segments) for i in range(segments + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def segment_means(curve: Curve, bounds: Sequence[Tuple[int, int]]) -> List[float]:
    """Mean loss in each stretch (steps without a loss left out; nan for an empty stretch)."""
    means = []
    for start, end in bounds:
        values = [v for v in curve[start:end] if v is not None]
        means.append(sum(values) / len(values) if values else math.nan)
    return means


def ema(values: Curve, span: int) -> List[float]:
    """Bias-corrected exponential moving average (for display); steps without a loss hold it."""
    alpha = 2.0 / (span + 1.0)
    smoothed: List[float] = []
    average = weight = 0.0
    for value in values:
        if value is not None and math.isfinite(value):
            average = (1.0 - alpha) * average + alpha * value
            weight = (1.0 - alpha) * weight + alpha
        smoothed.append(average / weight if weight else math.nan)
    return smoothed


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _sum_squares(values: Sequence[float]) -> float:
    centre = _mean(values)
    return sum((v - centre) ** 2 for v in values)


@dataclass
class Comparison:
    runs: int  # K pairs compared
    steps: int  # steps compared (the shortest run)
    bounds: List[Tuple[int, int]]  # the stretches (start, end) of steps
    before: List[float]  # per stretch: mean over seeds of the stretch means
    after: List[float]
    spread: List[float]  # per stretch: pooled seed-to-seed standard deviation (floored)
    band_ratios: List[float]  # per stretch: |after - before| / (spread x sqrt(2/K))
    worst: int  # the stretch with the largest ratio
    final_before: float
    final_after: float
    final_low: float  # 90% interval of the mean paired final difference (after - before)
    final_high: float
    final_margin: float  # the TOST margin (absolute)
    criterion: Criterion
    reasons: List[str] = field(default_factory=list)  # why not equivalent (empty: equivalent)

    @property
    def equivalent(self) -> bool:
        return not self.reasons

    @property
    def band_ratio(self) -> float:
        return self.band_ratios[self.worst] if self.band_ratios else 0.0

    @property
    def rms_ratio(self) -> float:
        return math.sqrt(sum(r * r for r in self.band_ratios) / len(self.band_ratios)) if self.band_ratios else 0.0

    @property
    def final_difference(self) -> float:
        """Relative difference of the final losses (after vs. before, means over seeds)."""
        if self.final_before == 0:
            return 0.0 if self.final_after == 0 else math.inf
        return (self.final_after - self.final_before) / abs(self.final_before)

    def steps_of(self, stretch: int) -> Tuple[int, int]:
        start, end = self.bounds[stretch]
        return start + 1, end


def compare(before: Sequence[Curve], after: Sequence[Curve], criterion: Criterion = DEFAULT) -> Comparison:
    """Decide whether the after runs train like the before runs (run k of each side: seed S+k)."""
    if len(before) != len(after) or len(before) < 2:
        raise ComparisonError(f"need the same number (2 or more) of before and after runs, got {len(before)} and {len(after)}")
    for index, curve in enumerate(before):
        bad = first_non_finite(curve)
        if bad is not None:
            raise ComparisonError(f"the before run with seed offset {index} has a loss that is not finite at step {bad + 1}; the before itself is unstable")
    steps = min(len(c) for c in (*before, *after))
    if steps < MIN_STEPS:
        raise ComparisonError(f"only {steps} optimizer steps ran in every run; at least {MIN_STEPS} are needed to compare")
    reasons: List[str] = []
    lengths = sorted({len(c) for c in (*before, *after)})
    if len(lengths) > 1:
        reasons.append(f"the runs made different numbers of optimizer steps ({', '.join(map(str, lengths))})")
    for index, curve in enumerate(after):
        bad = first_non_finite(curve[:steps])
        if bad is not None:
            reasons.append(f"the after loss is not finite from step {bad + 1} (seed offset {index})")
            break

    bounds = segment_bounds(steps, criterion.segments)
    means_before = [segment_means(c[:steps], bounds) for c in before]
    means_after = [segment_means([v if v is None or math.isfinite(v) else None for v in c[:steps]], bounds) for c in after]
    k = len(before)
    scale = math.sqrt(2.0 / k)  # standard error of a mean paired difference, in spreads
    centre_before, centre_after, pooled = [], [], []
    for m in range(len(bounds)):
        b = [row[m] for row in means_before]
        a = [row[m] for row in means_after]
        if any(math.isnan(v) for v in b):
            raise ComparisonError("a before run recorded no loss in a stretch of its steps")
        centre_before.append(_mean(b))
        finite = not any(math.isnan(v) or math.isinf(v) for v in a)
        centre_after.append(_mean(a) if finite else math.inf)
        pooled.append((_sum_squares(b) + (_sum_squares(a) if finite else _sum_squares(b))) / (2 * (k - 1)))
    # The spread of a stretch is estimated with its neighbours' (the spread changes slowly along a
    # run): 3x the degrees of freedom, so one stretch's lucky small estimate does not fail a run.
    spread, ratios = [], []
    for m, cb in enumerate(centre_before):
        window = pooled[max(0, m - 1): m + 2]
        s = max(math.sqrt(_mean(window)), MIN_RELATIVE_SPREAD * abs(cb), 1e-12)
        spread.append(s)
        ratios.append(abs(centre_after[m] - cb) / (s * scale))
    worst = max(range(len(ratios)), key=ratios.__getitem__)

    final_b = [row[-1] for row in means_before]
    final_a = [row[-1] for row in means_after]
    differences = [a - b for a, b in zip(final_a, final_b)]
    if all(math.isfinite(d) for d in differences):
        centre = _mean(differences)
        half = t95(k - 1) * math.sqrt(_sum_squares(differences) / (k - 1)) / math.sqrt(k)
        low, high = centre - half, centre + half
    else:
        low, high = -math.inf, math.inf
    margin = max(criterion.margin * abs(centre_before[-1]), criterion.spread_margin * spread[-1])

    result = Comparison(
        runs=k, steps=steps, bounds=bounds, before=centre_before, after=centre_after, spread=spread,
        band_ratios=ratios, worst=worst, final_before=centre_before[-1], final_after=centre_after[-1],
        final_low=low, final_high=high, final_margin=margin, criterion=criterion, reasons=reasons,
    )
    if not reasons:
        if result.band_ratio > criterion.band:
            first, last = result.steps_of(worst)
            reasons.append(
                f"over steps {first}-{last} the mean loss is {centre_after[worst]:.4g} after vs. {centre_before[worst]:.4g} "
                f"before: {result.band_ratio:.1f} standard errors of the seed-to-seed spread (limit {criterion.band:g})"
            )
        elif result.rms_ratio > criterion.rms_band:
            reasons.append(
                f"the mean loss differs from the before's by {result.rms_ratio:.1f} standard errors of the seed-to-seed "
                f"spread on average over the run (limit {criterion.rms_band:g}), {result.band_ratio:.1f} at most"
            )
        if low < -margin or high > margin:
            reasons.append(
                f"the final loss differs by {centre_after[-1] - centre_before[-1]:+.4g} (90% interval "
                f"{low:+.4g} to {high:+.4g}), not within the equivalence margin +-{margin:.4g}"
            )
    return result
