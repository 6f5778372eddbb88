"""Statistics over repeated measurements, kept apart from the data model (in the spirit of asv).

Timings are summarised as median [min, max] with the coefficient of variation; a change between
two samples is only called when it is both statistically significant (two-sided Mann-Whitney U)
and larger than a noise threshold. With very few samples the exact U test cannot reach the
significance level at all; that case is reported as "too few samples" instead of "no change".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    cv: float  # sample standard deviation / mean; 0 for a single sample

    @property
    def noisy(self) -> bool:
        return self.cv > CV_FLAG

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
    array = np.asarray(data, dtype=float)
    mean = float(array.mean())
    cv = float(array.std(ddof=1) / mean) if len(array) > 1 and mean != 0 else 0.0
    return Summary(n=len(array), median=float(np.median(array)), min=float(array.min()),
                   max=float(array.max()), mean=mean, cv=cv)


def min_p_value(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value the exact U test can give for these sample sizes."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


@dataclass(frozen=True)
class Change:
    """The outcome of comparing sample B against sample A (B/A > 1: B is slower)."""

    ratio: float | None  # median(B) / median(A)
    p_value: float | None
    verdict: str  # "slower" | "faster" | "same" | "noise" | "too few samples" | "no data"
    threshold: float

    @property
    def flagged(self) -> bool:
        return self.verdict in ("slower", "faster")


def compare_samples(a: Sequence[float], b: Sequence[float], threshold: float = NOISE_THRESHOLD,
                    alpha: float = ALPHA) -> Change:
    """Mann-Whitney U plus a noise threshold: flag only significant changes beyond the noise.

    - "slower"/"faster": p < alpha and |ratio - 1| > threshold;
    - "noise": significant but within the threshold (real but too small to matter);
    - "same": not significant;
    - "too few samples": the exact test cannot reach alpha with these sizes.
    """
    a, b = clean(a), clean(b)
    if not a or not b:
        return Change(None, None, "no data", threshold)
    median_a = float(np.median(a))
    ratio = float(np.median(b)) / median_a if median_a else None
    if min_p_value(len(a), len(b)) >= alpha:
        return Change(ratio, None, "too few samples", threshold)
    if len(set(a) | set(b)) == 1:  # all equal: U is undefined, and nothing changed
        return Change(ratio, 1.0, "same", threshold)
    p_value = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    if p_value >= alpha:
        verdict = "same"
    elif ratio is None or abs(ratio - 1.0) <= threshold:
        verdict = "noise"
    else:
        verdict = "slower" if ratio > 1.0 else "faster"
    return Change(ratio, p_value, verdict, threshold)


def noise_floor(ratios: Iterable[float | None]) -> float | None:
    """The noise floor from A/A ratios: the largest |ratio - 1| seen between identical configs."""
    deviations = [abs(r - 1.0) for r in clean(ratios)]
    return max(deviations) if deviations else None
