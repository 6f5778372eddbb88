"""Step detection: the revisions where a metric changed beyond noise (in the spirit of asv).

A metric measured at a series of engine revisions, in commit order, is modelled as piecewise
constant plus noise: the level stays the same until a commit changes it. ``detect_steps``
finds those commits.

**The fit.** Each point ``i`` is a revision with its runs' values; it enters as ``x_i``, the
median of the logarithms of its values (timings change by factors, so levels and noise are
relative; a metric with a value <= 0 is fitted on its own scale). For every number of
segments ``k = 1 .. max_segments`` the exact best fit is found by dynamic programming: the
segment boundaries and levels ``mu_r`` minimising the weighted L1 error
``sum_i w_i |x_i - mu_r(i)|`` (each level is its segment's weighted median; L1 rather than
least squares so that one outlying run moves no boundary). A point's weight ``w_i`` is the
inverse of its standard error over its runs (``1.4826 MAD / sqrt(n)``, raised to the
median of the points' standard errors, so that a point that happened to repeat exactly does
not dominate); points measured once get the median weight.

**The number of steps** is chosen by a Schwarz-type information criterion with AR(1) noise
(asv's step detection, docs/source/step_detection.rst, follows the same idea: noise on a
benchmark machine drifts, so consecutive deviations are correlated):

    IC(k) = beta * k * ln(m) / m + ln(sigma_0 + min_rho mean_w |e_i - rho e_(i-1)|)

where ``m`` is the number of points, ``e_i = x_i - mu_r(i)`` the deviations from the fit,
``rho`` in [-0.9, 0.9] the noise's autocorrelation (fitted per ``k``), and ``sigma_0`` the
noise floor: the median standard error of the points over their runs, at least ``floor``.
Without ``sigma_0`` a fit through every point would always win (``ln 0``); with it, a fit
that explains the points more closely than their own run-to-run noise gains nothing.

**Beyond noise.** A step is reported only if the fit that has it scores best among the fits
all of whose steps pass both tests: its ratio ``after / before`` differs from 1 by more than
``threshold`` (relative, default 5 %), and its size on the fitted scale exceeds
``noise_factor`` times the noise: the largest of ``sigma_0`` (run-to-run noise within a
revision), the noise from one revision to the next (``1.4826 median |x_i - x_(i-1)| /
sqrt 2`` over the differences inside the fit's segments: the drift of a loaded or warming
board that the runs of one revision do not show) and the fit's own mean absolute innovation.
The fit with no step always qualifies: the search always ends, on pure noise mostly there.

Parameters (``StepParams``): ``beta`` (2.0: the penalty per segment; Schwarz's own constant
is 0.5 per parameter and a step costs a level and a position; 2.0 was chosen by simulation:
5 % run noise plus AR(1) drift between revisions as large again (rho 0.5), 3 runs a
revision: false steps on pure noise in 8 % of series of 5 revisions, 1 % of 10, 0 % of 30; a
2x step found at its commit in 86 %, 94 %, 99 %; with 3 revisions drift cannot be told
from a step: 21 % false steps, mostly small), ``threshold`` (0.05),
``noise_factor`` (3.0), ``floor`` (0.01: one per cent, the smallest noise assumed),
``max_segments`` (8). The fit is exact (asv approximates it for long series); its cost is
O(m^3 log m) for m points, milliseconds for the tens of revisions a history holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# the method's name and version: steps kept by what they were found in (reports.history) are
# found again once it changes
METHOD = "weighted-L1 fit, Schwarz criterion with AR(1) noise, v1"
MAD_TO_SD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation
RHOS = np.round(np.arange(-0.9, 0.91, 0.05), 2)


@dataclass(frozen=True)
class StepParams:
    beta: float = 2.0
    threshold: float = 0.05
    noise_factor: float = 3.0
    floor: float = 0.01
    max_segments: int = 8


DEFAULT_PARAMS = StepParams()


@dataclass(frozen=True)
class Step:
    """A change of level: ``index`` is the first point at the new level."""

    index: int
    before: float  # the level before, in the metric's units
    after: float

    @property
    def ratio(self) -> float | None:
        return self.after / self.before if self.before else None


@dataclass(frozen=True)
class Fit:
    bounds: list[int]  # the first index of every segment after the first
    levels: list[float]  # one per segment, on the fitted scale
    innovation: float  # the mean absolute AR(1) innovation (weighted)
    score: float  # IC(k)


def robust_sd(values: Sequence[float]) -> float | None:
    """1.4826 x the median absolute deviation: a standard deviation one outlier cannot inflate."""
    if len(values) < 2:
        return None
    array = np.asarray(values, dtype=float)
    return float(MAD_TO_SD * np.median(np.abs(array - np.median(array))))


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x, kind="mergesort")
    cumulative = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cumulative, cumulative[-1] / 2.0)])


def _segment_costs(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cost[i, j], level[i, j]: the best L1 error and level of points i .. j-1 as one segment."""
    m = len(x)
    cost = np.full((m + 1, m + 1), np.inf)
    level = np.zeros((m + 1, m + 1))
    for i in range(m):
        for j in range(i + 1, m + 1):
            mu = _weighted_median(x[i:j], w[i:j])
            level[i, j] = mu
            cost[i, j] = float(np.sum(w[i:j] * np.abs(x[i:j] - mu)))
    return cost, level


def _best_fits(x: np.ndarray, w: np.ndarray,
               max_segments: int) -> list[tuple[list[int], list[float]]]:
    """For k = 1 .. K segments, the boundaries and levels of the exact best weighted-L1 fit."""
    m = len(x)
    cost, level = _segment_costs(x, w)
    top = min(max_segments, m)
    best = np.full((top + 1, m + 1), np.inf)
    back = np.zeros((top + 1, m + 1), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, top + 1):
        for j in range(k, m + 1):
            candidates = best[k - 1, k - 1:j] + cost[k - 1:j, j]
            pick = int(np.argmin(candidates))
            best[k, j], back[k, j] = candidates[pick], pick + k - 1
    fits = []
    for k in range(1, top + 1):
        starts, j = [], m
        for segments in range(k, 0, -1):
            i = back[segments, j]
            starts.append(i)
            j = i
        starts.reverse()
        ends = starts[1:] + [m]
        fits.append((starts[1:], [float(level[i, e]) for i, e in zip(starts, ends, strict=True)]))
    return fits


def _innovation(x: np.ndarray, w: np.ndarray, bounds: list[int], levels: list[float]) -> float:
    """min over rho of the weighted mean |e_i - rho e_(i-1)|, e the deviations from the fit."""
    fitted = np.repeat(levels, np.diff([0, *bounds, len(x)]))
    e = x - fitted
    previous = np.concatenate([[0.0], e[:-1]])
    totals = [float(np.sum(w * np.abs(e - rho * previous))) for rho in RHOS]
    return min(totals) / float(np.sum(w))


def _point_noise(points: Sequence[Sequence[float]], scale) -> list[float | None]:
    """Each point's standard error over its runs on the fitted scale (None when run once)."""
    out = []
    for values in points:
        sd = robust_sd([scale(v) for v in values])
        out.append(None if sd is None else sd / math.sqrt(len(values)))
    return out


def detect_steps(points: Sequence[Sequence[float]],
                 params: StepParams = DEFAULT_PARAMS) -> list[Step]:
    """The steps of a series: ``points[i]`` holds the values of the runs at revision ``i``
    (commit order); points without values are skipped by the caller. See the module's text."""
    if any(not values for values in points):
        raise ValueError("every point needs at least one value")
    if len(points) < 2:
        return []
    positive = all(v > 0 for values in points for v in values)
    scale = math.log if positive else float
    x = np.asarray([float(np.median([scale(v) for v in values])) for values in points])
    noise = _point_noise(points, scale)
    known = [s for s in noise if s is not None and s > 0]
    typical = float(np.median(known)) if known else None
    floor = params.floor if positive else params.floor * max(float(np.median(np.abs(x))), 1e-12)
    sigma_0 = max(floor, typical or 0.0)
    w = np.asarray([1.0 / max(s if s is not None else (typical or 1.0), typical or 1e-12)
                    for s in noise])
    w = w / float(np.median(w))
    m = len(x)
    fits = []
    for bounds, levels in _best_fits(x, w, params.max_segments):
        innovation = _innovation(x, w, bounds, levels)
        score = params.beta * len(levels) * math.log(m) / m + math.log(sigma_0 + innovation)
        fits.append(Fit(bounds, levels, innovation, score))
    fits.sort(key=lambda fit: (fit.score, len(fit.levels)))
    unscale = math.exp if positive else float
    for fit in fits:  # the fit with one segment has no step to fail: the loop returns
        steps = [Step(b, unscale(fit.levels[r]), unscale(fit.levels[r + 1]))
                 for r, b in enumerate(fit.bounds)]
        size = params.noise_factor * max(sigma_0, _between_noise(x, fit.bounds), fit.innovation)
        if all(_beyond(fit.levels[r], fit.levels[r + 1], step, params.threshold, size)
               for r, step in enumerate(steps)):
            break
    return steps


def _between_noise(x: np.ndarray, bounds: list[int]) -> float:
    """The noise from one revision to the next: 1.4826 x the median |x_i - x_(i-1)| / sqrt 2
    over the differences inside the fit's segments (none across its steps). It sees the drift
    between revisions (load, heat) that the runs of one revision do not show; 0 when no
    segment has two points."""
    inside = [abs(x[i] - x[i - 1]) for i in range(1, len(x)) if i not in bounds]
    return float(MAD_TO_SD * np.median(inside) / math.sqrt(2.0)) if inside else 0.0


def _beyond(low: float, high: float, step: Step, threshold: float, limit: float) -> bool:
    ratio = step.ratio
    relative = ratio is None or abs(ratio - 1.0) > threshold
    return relative and abs(high - low) > limit


def differs_beyond_noise(reference: Sequence[Sequence[float]], other: Sequence[Sequence[float]],
                         params: StepParams = DEFAULT_PARAMS) -> tuple[float, float]:
    """(ratio, limit) of two revisions measured on the same configs: ``reference[c]`` and
    ``other[c]`` hold the runs' values of config ``c``. The ratio is the geometric mean over
    the configs of median(other) / median(reference); ``limit`` is the relative change beyond
    which it counts as a change: ``threshold``, raised to ``noise_factor`` times the pooled
    run-to-run noise of both (the median robust sd of the log values per config)."""
    if not reference or len(reference) != len(other):
        raise ValueError("both revisions need values for the same configs")
    logs = [math.log(float(np.median(b)) / float(np.median(a)))
            for a, b in zip(reference, other, strict=True)]
    sds = [s for values in (*reference, *other)
           if (s := robust_sd([math.log(v) for v in values])) is not None]
    noise = float(np.median(sds)) if sds else 0.0
    limit = max(params.threshold, math.exp(params.noise_factor * noise) - 1.0)
    return math.exp(float(np.mean(logs))), limit
