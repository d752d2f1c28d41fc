"""The equivalence criterion of `verify` on synthetic curves (no torch, no subprocess)."""

from __future__ import annotations

import math
import random

import pytest

from ampmigrate.verify.stats import (
    FLOOR_MULTIPLE,
    MIN_RELATIVE_FLOOR,
    ComparisonError,
    compare,
    ema,
    span_for,
)


def training_curve(steps=200, seed=0, rate=0.05, noise=0.05, start=3.5, end=1.5):
    """An exponentially decaying loss with batch noise, like a real run."""
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-rate * t) + rng.gauss(0.0, noise) for t in range(steps)]


def test_ema_is_bias_corrected_and_holds_over_missing_steps():
    assert ema([2.0, 2.0, 2.0], span=10) == pytest.approx([2.0, 2.0, 2.0])
    smoothed = ema([1.0, None, 3.0], span=3)  # alpha 0.5
    assert smoothed[0] == pytest.approx(1.0)
    assert smoothed[1] == pytest.approx(1.0)
    assert smoothed[2] == pytest.approx((0.25 * 1.0 + 0.5 * 3.0) / 0.75)


def test_span_scales_with_the_run():
    assert span_for(50) == 5
    assert span_for(200) == 10
    assert span_for(100000) == 50


def test_rounding_noise_is_equivalent_and_another_learning_rate_is_not():
    baseline = training_curve(seed=0)
    noise = [training_curve(seed=1), training_curve(seed=2)]
    rng = random.Random(9)
    rounded = [v + rng.gauss(0.0, 1e-4) for v in baseline]  # same run, different rounding
    same = compare(baseline, rounded, noise)
    assert same.equivalent, same.reasons
    assert same.ratio < 0.1
    faster = compare(baseline, training_curve(seed=0, rate=0.1), noise)
    assert not faster.equivalent
    assert any("noise floor" in reason for reason in faster.reasons)
    assert faster.ratio > FLOOR_MULTIPLE


def test_a_fresh_seed_is_within_the_floor():
    baseline = training_curve(seed=0)
    result = compare(baseline, training_curve(seed=3), [training_curve(seed=1), training_curve(seed=2)])
    assert result.equivalent, result.reasons


def test_final_loss_outside_tolerance_is_not_equivalent_even_within_the_floor():
    baseline = training_curve(seed=0)
    noise = [training_curve(seed=1, noise=0.5), training_curve(seed=2, noise=0.5)]  # a very noisy floor
    shifted = [v * 1.08 for v in baseline]
    result = compare(baseline, shifted, noise, tolerance=0.05)
    assert result.ratio < FLOOR_MULTIPLE
    assert not result.equivalent
    assert result.final_difference == pytest.approx(0.08, rel=1e-6)
    assert compare(baseline, shifted, noise, tolerance=0.1).equivalent


def test_a_loss_that_stops_being_finite_is_not_equivalent():
    baseline = training_curve(seed=0)
    after = baseline[:50] + [math.inf] + [math.nan] * 149
    result = compare(baseline, after, [training_curve(seed=1)])
    assert not result.equivalent
    assert result.reasons == ["the after loss is not finite from step 51"]
    assert result.max_deviation == math.inf


def test_an_unstable_baseline_or_a_short_run_cannot_be_compared():
    baseline = training_curve(seed=0)
    with pytest.raises(ComparisonError, match="baseline seed run 1 loss is not finite at step 3"):
        compare(baseline, baseline, [baseline[:2] + [math.nan] + baseline[3:]])
    with pytest.raises(ComparisonError, match="at least 10"):
        compare(baseline[:5], baseline[:5], [baseline[:5]])
    with pytest.raises(ComparisonError, match="--runs 2"):
        compare(baseline, baseline, [])


def test_the_floor_never_drops_below_the_minimum():
    baseline = training_curve(seed=0)
    result = compare(baseline, baseline, [list(baseline)])  # a script that ignores the seed
    assert result.floor_raised
    median = sorted(result.baseline)[len(result.baseline) // 2]
    assert result.noise_floor == pytest.approx(MIN_RELATIVE_FLOOR * median)
    assert result.equivalent


def test_runs_of_different_length_are_compared_over_the_common_steps_but_flagged():
    baseline = training_curve(seed=0)
    result = compare(baseline, baseline[:150], [training_curve(seed=1)])
    assert result.steps == 150
    assert not result.equivalent
    assert "different numbers of optimizer steps (200 before, 150 after)" in result.reasons[0]
