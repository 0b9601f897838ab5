"""timing_stats: summaries and the bootstrap ratio of medians, as properties (Hypothesis) and
on the cases a build and a regression check meet (clear change, no change, change below the
threshold)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetune.artifact_format.timing_stats import (
    FASTER,
    SAME,
    SLOWER,
    RatioEstimate,
    compare,
    ratio_of_medians,
    summarize,
)

# Latencies in ms: positive, finite, over six orders of magnitude; 1 to 40 samples.
latency = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
samples = st.lists(latency, min_size=1, max_size=40)
scale = st.floats(min_value=0.01, max_value=100.0)

FAST = settings(max_examples=60, deadline=None)


def _noisy(center: float, count: int, spread: float, seed: int) -> list[float]:
    """Latency-like samples: `center` times 1 + |normal| * spread (a right tail, like a busy host)."""
    rng = np.random.default_rng(seed)
    return list(center * (1.0 + np.abs(rng.standard_normal(count)) * spread))


@FAST
@given(samples, scale)
def test_ratio_of_a_set_to_itself_scaled_is_the_scale(values, k):
    scaled = [v * k for v in values]
    estimate = ratio_of_medians(scaled, values)
    assert math.isclose(estimate.ratio, k, rel_tol=1e-9)
    assert estimate.low <= k * (1 + 1e-9) and estimate.high >= k * (1 - 1e-9)


@FAST
@given(samples, samples)
def test_interval_is_ordered_and_contains_the_point_estimate(top, bottom):
    estimate = ratio_of_medians(top, bottom)
    assert 0 < estimate.low <= estimate.ratio <= estimate.high
    assert estimate.ratio == pytest.approx(float(np.median(top) / np.median(bottom)), rel=1e-12)


@FAST
@given(samples, samples, st.randoms(use_true_random=False))
def test_order_of_samples_does_not_matter(top, bottom, rnd):
    shuffled_top, shuffled_bottom = list(top), list(bottom)
    rnd.shuffle(shuffled_top)
    rnd.shuffle(shuffled_bottom)
    assert ratio_of_medians(shuffled_top, shuffled_bottom) == ratio_of_medians(top, bottom)


@FAST
@given(samples, samples)
def test_swapping_the_sets_inverts_the_ratio(top, bottom):
    forward, backward = ratio_of_medians(top, bottom), ratio_of_medians(bottom, top)
    assert forward.ratio * backward.ratio == pytest.approx(1.0, rel=1e-9)


@FAST
@given(samples, scale)
def test_summary_is_ordered_and_scales(values, k):
    summary = summarize(values)
    assert summary.min <= summary.median <= summary.max and summary.count == len(values)
    assert 0 <= summary.iqr <= summary.max - summary.min + 1e-12 * summary.max
    scaled = summarize([v * k for v in values])
    assert scaled.median == pytest.approx(summary.median * k, rel=1e-9)
    assert scaled.iqr == pytest.approx(summary.iqr * k, rel=1e-9, abs=1e-12)


def test_summary_of_known_samples():
    summary = summarize([3.0, 1.0, 2.0, 4.0, 100.0])
    assert (summary.median, summary.iqr, summary.min, summary.max, summary.count) == (3.0, 2.0, 1.0, 100.0, 5)


def test_same_inputs_and_seed_give_the_same_estimate():
    top, bottom = _noisy(2.0, 12, 0.05, 1), _noisy(1.0, 12, 0.05, 2)
    assert ratio_of_medians(top, bottom) == ratio_of_medians(list(top), list(bottom))
    other_seed = ratio_of_medians(top, bottom, seed=1)
    assert other_seed.ratio == ratio_of_medians(top, bottom).ratio and other_seed.low <= 2.0 * 1.1


def test_more_samples_narrow_the_interval():
    narrow = ratio_of_medians(_noisy(2.0, 48, 0.05, 3), _noisy(1.0, 48, 0.05, 4))
    wide = ratio_of_medians(_noisy(2.0, 6, 0.05, 3), _noisy(1.0, 6, 0.05, 4))
    assert narrow.high - narrow.low < wide.high - wide.low
    assert narrow.low < 2.0 * 1.05 and narrow.high > 2.0 * 0.95


@pytest.mark.parametrize(
    "factor, threshold, verdict",
    [
        (2.0, 1.0, SLOWER),  # twice as slow: a regression
        (0.5, 1.0, FASTER),  # twice as fast: what tuning should give
        (1.0, 1.0, SAME),  # the same build again
        (1.03, 1.10, SAME),  # 3 % slower with a 10 % threshold: not a regression
        (1.30, 1.10, SLOWER),
        (1 / 1.30, 1.10, FASTER),
    ],
)
def test_compare_verdicts(factor, threshold, verdict):
    baseline = _noisy(1.0, 12, 0.02, 5)
    candidate = _noisy(factor, 12, 0.02, 6) if factor != 1.0 else _noisy(1.0, 12, 0.02, 7)
    result = compare(baseline, candidate, threshold)
    assert result.verdict == verdict, result
    assert result.estimate.ratio == pytest.approx(factor, rel=0.05)
    assert result.threshold == threshold


def test_noise_wider_than_the_change_is_not_a_verdict():
    baseline, candidate = _noisy(1.0, 6, 0.5, 8), _noisy(1.05, 6, 0.5, 9)
    result = compare(baseline, candidate)
    assert result.verdict == SAME and result.estimate.low < 1.0 < result.estimate.high


def test_describe_reads_as_ratio_and_interval():
    assert RatioEstimate(1.934, 1.881, 1.992, 0.95).describe() == "1.934x [1.881, 1.992] (95 %)"
    assert RatioEstimate(22.83, 21.61, 24.04, 0.9).describe() == "22.8x [21.6, 24.0] (90 %)"
    assert RatioEstimate(2.964, 2.885, 3.1, 0.95).describe() == "2.96x [2.88, 3.10] (95 %)"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: summarize([]), "samples must not be empty"),
        (lambda: summarize([1.0, -2.0]), "finite and positive"),
        (lambda: summarize([1.0, float("nan")]), "finite and positive"),
        (lambda: summarize(["1.0"]), "sequence of numbers"),
        (lambda: summarize([True]), "sequence of numbers"),
        (lambda: ratio_of_medians([1.0], [0.0]), "denominator must be finite and positive"),
        (lambda: ratio_of_medians([1.0], [1.0], confidence=1.0), "confidence"),
        (lambda: ratio_of_medians([1.0], [1.0], resamples=10), "resamples"),
        (lambda: compare([1.0], [1.0], threshold=0.9), "threshold must be a finite ratio >= 1"),
    ],
)
def test_invalid_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
