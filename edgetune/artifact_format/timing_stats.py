"""Statistics of latency samples: summaries and noise-aware comparisons (numpy only, pure).

The timing of a library on a board is a set of samples (each the mean time of one call over a
repeat of at least a few hundred milliseconds, see `measure.py`). Samples are noisy and not
normally distributed (a shared host, CPU quota throttling), so everything here is
distribution-free:
- `summarize`: median, interquartile range (IQR), min and max;
- `ratio_of_medians`: median(numerator) / median(denominator) with a percentile bootstrap
  confidence interval, resampling both sets independently. The bootstrap is seeded and the
  samples are sorted first, so equal inputs in any order give identical results;
- `compare`: the verdict on a candidate against a baseline - "slower", "faster" or "same" -
  from where that interval lies relative to a threshold ratio.

Used by `edgetune build` (is the tuned build faster than the untuned one beyond noise?) and
by the regression check (is the deployed build slower than its baseline?).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 4000
DEFAULT_SEED = 20240611

FASTER, SLOWER, SAME = "faster", "slower", "same"


@dataclass(frozen=True)
class Summary:
    """Location and spread of one sample set."""

    median: float
    iqr: float  # interquartile range: 75th - 25th percentile (numpy's linear interpolation)
    min: float
    max: float
    count: int


@dataclass(frozen=True)
class RatioEstimate:
    """median(numerator) / median(denominator), and a `confidence` interval [low, high] for it.
    The interval always contains `ratio`."""

    ratio: float
    low: float
    high: float
    confidence: float

    def above(self, value: float) -> bool:
        """The whole interval lies above `value`."""
        return self.low > value

    def below(self, value: float) -> bool:
        """The whole interval lies below `value`."""
        return self.high < value

    def describe(self) -> str:
        """E.g. '1.934x [1.881, 1.992] (95 %)' or '22.8x [21.6, 24.0] (95 %)'."""
        low, high = ratio_text(self.low), ratio_text(self.high)
        return f"{ratio_text(self.ratio)}x [{low}, {high}] ({self.confidence * 100:g} %)"


@dataclass(frozen=True)
class Comparison:
    """A candidate's timing against a baseline's. `estimate` is the time ratio candidate /
    baseline (2.0: the candidate takes twice as long). `verdict` is SLOWER when the whole
    interval lies above `threshold`, FASTER when it lies below 1 / `threshold`, SAME otherwise
    (no change beyond noise and the threshold)."""

    verdict: str
    estimate: RatioEstimate
    threshold: float


def summarize(samples: Sequence[float]) -> Summary:
    """Median, IQR, min, max and count of `samples` (finite, positive)."""
    import numpy as np  # here, not above: the board agent's verbs that time nothing start without numpy

    values = _checked(samples, "samples")
    q1, median, q3 = np.percentile(values, [25.0, 50.0, 75.0])
    return Summary(
        median=float(median), iqr=float(q3 - q1), min=float(values[0]), max=float(values[-1]), count=len(values)
    )


def ratio_of_medians(
    numerator: Sequence[float],
    denominator: Sequence[float],
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> RatioEstimate:
    """median(numerator) / median(denominator) with a percentile bootstrap interval.

    Each of `resamples` rounds draws both sets with replacement (independently, each at its
    own size) and takes the ratio of their medians; the interval is the central `confidence`
    part of those ratios, widened if needed to contain the point estimate (which percentile
    intervals of very small or lumpy samples can miss). Deterministic: the same multisets
    and seed give the same result, whatever the order of the samples."""
    import numpy as np

    top, bottom = _checked(numerator, "numerator"), _checked(denominator, "denominator")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an integer of at least 100, got {resamples!r}")
    ratio = float(np.median(top) / np.median(bottom))
    rng = np.random.default_rng(seed)
    top_medians = np.median(rng.choice(top, size=(resamples, len(top))), axis=1)
    bottom_medians = np.median(rng.choice(bottom, size=(resamples, len(bottom))), axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(top_medians / bottom_medians, [tail, 100.0 - tail])
    return RatioEstimate(ratio=ratio, low=min(float(low), ratio), high=max(float(high), ratio), confidence=confidence)


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    threshold: float = 1.0,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Is `candidate` (time samples) slower, faster or the same as `baseline`?

    `threshold` (>= 1) is the smallest time ratio that counts as a change: with 1.05 the
    candidate is SLOWER only if its time is more than 5 % above the baseline's with
    `confidence` (the interval of candidate / baseline lies above 1.05), FASTER only if the
    interval lies below 1 / 1.05. With 1.0, any change beyond noise counts."""
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold >= 1.0):
        raise ValueError(f"threshold must be a finite ratio >= 1, got {threshold!r}")
    estimate = ratio_of_medians(candidate, baseline, confidence=confidence, seed=seed)
    if estimate.above(threshold):
        verdict = SLOWER
    elif estimate.below(1.0 / threshold):
        verdict = FASTER
    else:
        verdict = SAME
    return Comparison(verdict=verdict, estimate=estimate, threshold=float(threshold))


def ratio_text(value: float) -> str:
    """A ratio for people: three decimals near 1 (where a percent matters), fewer above."""
    if value < 2:
        return f"{value:.3f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _checked(samples: Sequence[float], name: str) -> np.ndarray:
    """The samples as a sorted float64 array; ValueError unless all are finite and positive."""
    import numpy as np

    if isinstance(samples, (str, bytes)) or not all(_is_number(v) for v in samples):
        raise ValueError(f"{name} must be a sequence of numbers")
    values = np.sort(np.asarray(list(samples), dtype=np.float64))
    if values.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not (np.all(np.isfinite(values)) and values[0] > 0.0):
        raise ValueError(f"{name} must be finite and positive (times), got min {values[0]!r}")
    return values


def _is_number(value: object) -> bool:
    # numpy's integer and float scalars are numbers.Real; numpy.bool_ is not
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
