"""The equivalence decision of `verify` on synthetic curves (no torch, no subprocess).

Its error rates are measured by bench/verify_calibration.py; these tests pin the behaviour that
the rates rest on (pairing, the spread, the margin, the edge cases)."""

from __future__ import annotations

import math
import random

import pytest

from ampmigrate.verify.stats import DEFAULT, ComparisonError, Criterion, compare, ema, segment_bounds, segment_means


def run(seed, steps=200, rate=0.03, noise=0.05, start=3.5, end=1.5, init_spread=0.05, stream=0):
    """A decaying loss whose start depends on the seed (initial weights) and whose batch noise
    depends on the seed's random stream (`stream` shifts it: one extra random draw)."""
    init = random.Random(seed).gauss(0.0, init_spread)
    rng = random.Random(1000 * (stream + 1) + seed)
    return [end + (start + init - end) * math.exp(-rate * t) + rng.gauss(0.0, noise) for t in range(steps)]


def sides(k=DEFAULT.runs, **after):
    before = [run(seed) for seed in range(k)]
    return before, [run(seed, **after) for seed in range(k)]


def test_segments_cover_the_run_and_average_each_stretch():
    bounds = segment_bounds(200, 20)
    assert bounds[0] == (0, 10) and bounds[-1] == (190, 200) and len(bounds) == 20
    assert segment_means([1.0, None, 3.0, 5.0], [(0, 2), (2, 4)]) == [1.0, 4.0]


def test_ema_is_bias_corrected_and_holds_over_missing_steps():
    assert ema([2.0, 2.0, 2.0], span=10) == pytest.approx([2.0, 2.0, 2.0])
    smoothed = ema([1.0, None, 3.0], span=3)  # alpha 0.5
    assert smoothed[1] == pytest.approx(1.0)
    assert smoothed[2] == pytest.approx((0.25 * 1.0 + 0.5 * 3.0) / 0.75)


def test_the_same_training_with_rounding_noise_is_equivalent():
    before = [run(seed) for seed in range(4)]
    rng = random.Random(5)
    after = [[v + rng.gauss(0.0, 1e-4) for v in curve] for curve in before]
    result = compare(before, after)
    assert result.equivalent, result.reasons
    assert result.band_ratio < 0.5 and result.final_low < 0 < result.final_high


def test_another_random_stream_is_equivalent():
    before, after = sides(stream=77)
    result = compare(before, after)
    assert result.equivalent, result.reasons


@pytest.mark.parametrize("rate", [0.045, 0.02])  # the learning rate x1.5 and x0.67
def test_other_training_dynamics_are_not_equivalent(rate):
    before, after = sides(rate=rate)
    result = compare(before, after)
    assert not result.equivalent
    assert "standard errors of the seed-to-seed spread" in result.reasons[0]


def test_a_final_loss_outside_the_margin_is_not_equivalent():
    before, _ = sides()
    after = [[v * 1.5 for v in curve] for curve in before]  # the loss divided by 2 in the before
    result = compare(before, after)
    assert not result.equivalent
    assert any("not within the equivalence margin" in reason for reason in result.reasons)
    assert result.final_difference == pytest.approx(0.5, rel=1e-6)


def test_the_margin_is_the_larger_of_the_relative_margin_and_the_spread():
    before = [run(seed, noise=0.0, init_spread=0.0) for seed in range(3)]  # runs that ignore the seed
    after = [[v * 1.01 for v in curve] for curve in before]
    strict = compare(before, after, Criterion(runs=3, margin=0.005))
    loose = compare(before, after, Criterion(runs=3, margin=0.02))
    assert any("margin" in reason for reason in strict.reasons)
    assert loose.final_margin == pytest.approx(0.02 * loose.final_before)
    assert not any("margin" in reason for reason in loose.reasons)


def test_a_loss_that_stops_being_finite_is_not_equivalent():
    before, after = sides()
    after[1] = after[1][:50] + [math.inf] + [math.nan] * 149
    result = compare(before, after)
    assert result.reasons[0] == "the after loss is not finite from step 51 (seed offset 1)"


def test_an_unstable_before_or_a_short_run_cannot_be_compared():
    before, after = sides()
    before[2] = before[2][:2] + [math.nan] + before[2][3:]
    with pytest.raises(ComparisonError, match="seed offset 2 has a loss that is not finite at step 3"):
        compare(before, after)
    with pytest.raises(ComparisonError, match="at least 20"):
        compare([c[:5] for c in after], [c[:5] for c in after])
    with pytest.raises(ComparisonError, match="same number"):
        compare(after, after[:2])


def test_runs_of_different_length_are_compared_over_the_common_steps_but_flagged():
    before, after = sides()
    after[0] = after[0][:150]
    result = compare(before, after)
    assert result.steps == 150
    assert "different numbers of optimizer steps (150, 200)" in result.reasons[0]
