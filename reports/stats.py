"""Statistics over repeated measurements, kept apart from the data model (in the spirit of asv).

Timings are summarised as median [min, max] with the coefficient of variation; a change between
two samples is only called when it is both statistically significant (two-sided Mann-Whitney U)
and larger than a noise threshold. The samples are independent runs, never the steps of one
run. With very few runs the exact U test cannot reach the significance level at all; that case
is "inconclusive" (no p-value, and how many runs a side it would take) instead of "no change".
Many configs are summarised by the geometric mean of their ratios with a bootstrap CI.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from reports.metrics import NOISE_THRESHOLD

# A timing whose spread over repeats exceeds this is flagged as noisy.
CV_FLAG = 0.05
# Default relative change below which a difference is treated as noise (asv uses 5-10 %).
ALPHA = 0.05


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    min: float
    max: float
    mean: float
    # sample standard deviation / mean; None for a single sample (one run shows no spread:
    # reports leave its CV out instead of printing 0 %)
    cv: float | None

    @property
    def noisy(self) -> bool:
        return self.cv is not None and self.cv > CV_FLAG

    def text(self, digits: int = 2) -> str:
        """``median [min, max]``, the form every timing takes in the reports."""
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.min:.{digits}f}, {self.max:.{digits}f}]"


def clean(values: Iterable[float | None]) -> list[float]:
    """The finite values, in their order (missing and NaN measurements are dropped)."""
    out = []
    for value in values:
        if value is None:
            continue
        number = float(value)
        if math.isfinite(number):
            out.append(number)
    return out


def summarize(values: Iterable[float | None]) -> Summary | None:
    data = clean(values)
    if not data:
        return None
    if len(data) == 1:  # numpy's figures of one value (its sum starts at 0.0), without numpy
        value = data[0]
        return Summary(n=1, median=0.0 + value, min=value, max=value, mean=0.0 + value, cv=None)
    array = np.asarray(data, dtype=float)
    mean = float(array.mean())
    cv = float(array.std(ddof=1) / mean) if len(array) > 1 and mean != 0 else 0.0
    return Summary(n=len(array), median=float(np.median(array)), min=float(array.min()),
                   max=float(array.max()), mean=mean, cv=cv)


def median(values: Sequence[float]) -> float:
    """The median of finite values, bit for bit ``numpy.median``'s (the middle value, or the
    two middle ones' sum halved), without numpy's cost per call: a timeline has a point per
    revision and a nightly a thousand revisions."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (float(ordered[middle - 1]) + float(ordered[middle])) / 2.0


def series_mean(values: np.ndarray) -> float:
    """``pandas.Series.mean()`` of a float64 array, bit for bit: numpy's sum of the values
    with NaN as 0, over the count of the others (NaN when there are none), as pandas computes
    it; without a Series per cell."""
    missing = np.isnan(values)
    count = values.size - int(missing.sum())
    if not count:
        return math.nan
    if missing.any():
        values = np.where(missing, 0.0, values)
    return float(values.sum() / np.float64(count))


def series_median(values: Iterable[Any]) -> float:
    """``pandas.Series.median()`` of float values (NaN and None skipped; NaN when none are
    left), bit for bit, without a Series per cell."""
    present = [v for v in values if v is not None and v == v]
    return median(present) if present else math.nan


def min_p_value(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value the exact U test can give for these sample sizes."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def runs_needed(alpha: float = ALPHA) -> int:
    """The fewest independent runs a side (equal sides) with which the exact U test can
    reach ``alpha`` at all: 4 at alpha 0.05."""
    n = 1
    while min_p_value(n, n) >= alpha:
        n += 1
    return n


@dataclass(frozen=True)
class Change:
    """The outcome of comparing sample B against sample A (B/A > 1: B is slower)."""

    ratio: float | None  # median(B) / median(A)
    p_value: float | None
    verdict: str  # "slower" | "faster" | "unchanged" | "inconclusive" | "no data"
    threshold: float
    needed: int | None = None  # inconclusive: the independent runs a side a test needs

    @property
    def flagged(self) -> bool:
        return self.verdict in ("slower", "faster")


VERDICTS = ("faster", "slower", "unchanged", "inconclusive")


def compare_samples(a: Sequence[float], b: Sequence[float], threshold: float = NOISE_THRESHOLD,
                    alpha: float = ALPHA) -> Change:
    """Mann-Whitney U plus a noise threshold: flag only significant changes beyond the noise.

    The samples must be independent runs (repeats, or measurements taken on different
    occasions), never the decode steps of one run: steps of one process are autocorrelated
    and would make any difference look significant (pseudo-replication).

    - "slower"/"faster": p < alpha and |ratio - 1| > threshold;
    - "unchanged": not significant, or significant but within the threshold;
    - "inconclusive": too few runs for the exact test to reach alpha (no p-value); ``needed``
      says how many runs a side it takes.
    """
    a, b = clean(a), clean(b)
    if not a or not b:
        return Change(None, None, "no data", threshold)
    median_a = float(np.median(a))
    ratio = float(np.median(b)) / median_a if median_a else None
    if min_p_value(len(a), len(b)) >= alpha:
        return Change(ratio, None, "inconclusive", threshold, runs_needed(alpha))
    if len(set(a) | set(b)) == 1:  # all equal: U is undefined, and nothing changed
        return Change(ratio, 1.0, "unchanged", threshold)
    p_value = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    if p_value >= alpha or ratio is None or abs(ratio - 1.0) <= threshold:
        verdict = "unchanged"
    else:
        verdict = "slower" if ratio > 1.0 else "faster"
    return Change(ratio, p_value, verdict, threshold)


@dataclass(frozen=True)
class GeoMean:
    """The geometric mean of ratios with a bootstrap confidence interval over them."""

    value: float
    low: float
    high: float
    n: int

    def text(self) -> str:
        if self.n == 1:
            return f"{self.value:.3f}x (one config)"
        return f"{self.value:.3f}x [{CI_LEVEL:.0%} CI {self.low:.3f}, {self.high:.3f}]"


CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000


def geometric_mean_ci(ratios: Iterable[float | None], seed: int = 0) -> GeoMean | None:
    """Geometric mean of the positive ratios and a percentile bootstrap CI (resampling the
    ratios, e.g. one per config, with replacement; fixed seed: a report reproduces)."""
    logs = np.log([r for r in clean(ratios) if r > 0])
    if not len(logs):
        return None
    value = float(np.exp(logs.mean()))
    if len(logs) == 1:
        return GeoMean(value, value, value, 1)
    rng = np.random.default_rng(seed)
    means = rng.choice(logs, size=(BOOTSTRAP_RESAMPLES, len(logs))).mean(axis=1)
    tail = (1 - CI_LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return GeoMean(value, float(np.exp(low)), float(np.exp(high)), len(logs))


def noise_floor(ratios: Iterable[float | None]) -> float | None:
    """The noise floor from A/A ratios: the largest |ratio - 1| seen between identical configs."""
    deviations = [abs(r - 1.0) for r in clean(ratios)]
    return max(deviations) if deviations else None
