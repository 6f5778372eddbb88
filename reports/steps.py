"""Step detection: the revisions where a metric changed beyond noise.

A metric measured at a series of engine revisions, in commit order, is modelled as piecewise
constant plus noise: the level stays the same until a commit changes it. ``detect_steps``
finds those commits, as many as the data hold (no cap), in O(m^2) for m revisions at worst
and about linear time in practice: 0.1 s of CPU for 1000 revisions (``bench/steps.py``).

**The data.** Each point ``i`` is a revision with its runs' values; it enters as ``x_i``, the
median of the logarithms of its values (timings change by factors, so levels and noise are
relative; a metric with a value <= 0 is fitted on its own scale).

**The noise** has two parts. A point's own noise, white: its runs' spread, independent from
one revision to the next (variance ``e``, of a median of its runs); and drift between
revisions, AR(1): a loaded or warming board moves every run of a revision alike, and the next
revision's partly too (variance ``d``, correlation ``rho`` from one revision to the next), which
the runs of one revision do not show. Drift wanders, so over a few revisions it looks like a
level: a test that ignores it reports drift as steps, and one that fits the drift anew with
every candidate set of steps (asv's information criterion, this module's former one) lets a
large ``rho`` absorb real steps. Here ``e``, ``d`` and ``rho`` are estimated for the steps in
hand by restricted maximum likelihood (a Kalman filter over the series with a free level per
segment, on a grid of ``rho`` in 0-0.95 and of ``e`` and ``d``), the runs' spread (pooled over
the revisions with two runs or more) entering as a chi-square observation of ``e``.

**The fit**: outliers first, then two passes of candidates and judgement:

1. *Outliers.* A revision measured fewer than ``single_runs`` times cannot tell an outlying
   run from a change: one such point, or two neighbouring ones inside the series, that lie
   beyond ``clip`` robust standard deviations (1.4826 median |x_i - x_(i-1)| / sqrt 2) of
   the points on both sides of them, on the same side, take their nearer neighbour's value
   (the farthest first), and such a point never makes a segment of its own. A revision with
   ``single_runs`` runs or more carries its own evidence (one outlying run does not move its
   median): it may be a segment of its own, the newest revision of a history that just
   regressed for one, and its own runs' variance is added to its noise there.
2. *Candidates.* Optimal partitioning of the points, least squares per segment in units of
   the point variance ``e + d`` plus ``beta ln m`` a step, with PELT's pruning (a start that
   can never win again is dropped): O(m^2) at worst, about O(m) when there are steps. It
   proposes more steps than the data hold; the next part keeps those beyond noise.
3. *Beyond noise.* Each step's size is estimated by generalised least squares from the two
   segments it separates, under the noise model (the Kalman filter whitens them), and the
   weakest step that is not beyond noise is dropped, then the next, until every one left is
   (a drop re-judges its two neighbours only: O(m) each). A step is beyond noise when its
   ratio ``after / before`` (of the segments' means; of a positive metric, the larger of
   that and its inverse, so that a step down is judged as the step up it undoes) differs
   from 1 by more than ``threshold`` and its size exceeds ``significance`` standard errors,
   raised by the ratio of Student's t to the normal quantile at 97.5 % for the degrees of
   freedom of the noise's estimate (Satterthwaite's, from the runs' for ``e`` and the
   points' beyond the levels for ``d``): a short history, whose drift is poorly known, needs
   a larger step.

The first pass starts from a rough noise (``e`` from the runs, ``d`` from the differences of
neighbouring revisions when there are more than 5, ``rho`` 0.5) and is lenient (0.6 x the
significance, 0.36 x the penalty); the noise is then estimated with its steps, the second
pass fitted with that, and the noise estimated again for the final judgement of the second
pass's steps.

**Parameters** (``StepParams``), chosen with ``bench/steps.py``'s simulation: 10-1000 revisions,
1-5 runs each, 1-5 % log-normal run noise, AR(1) drift between revisions (``rho`` 0.3-0.8, 0.25-1x
the run noise), 1 % of runs 1.3-3x slow, 0-20 steps of 0.5x-2x, 40 % of them 1.1x-1.2x; a step
found within one revision of its commit counts:

* ``significance`` (4.5): the standard errors a step must exceed. F1 at 10 / 30 / 100 / 300
  revisions and false steps per 100 revisions of flat series (seed 3; 20 000 flat revisions a
  length): 3.5: 0.98 / 0.96 / 0.99 / 0.99, up to 0.20 false; 4.0: 0.97 / 0.97 / 0.99 / 0.98,
  up to 0.095; 4.25: 0.96 / 0.96 / 0.99 / 0.98, up to 0.07; 4.5: 0.96 / 0.96 / 0.98 / 0.98,
  up to 0.04; 5.0: 0.95 / 0.96 / 0.97 / 0.98, up to 0.025. At 10 revisions, where the others
  come closest (2000 series, seeds 1 and 2): 4.0: 0.96 / 0.96, 0.09-0.105 false; 4.25: 0.96 /
  0.95, 0.055-0.06; 4.5: 0.95 / 0.94, 0.04; Otava 0.93 / 0.92, 0.5-0.6. 4.5 keeps them at
  0.04 per 100 revisions or fewer, so that a draw of the bench's 10 000 flat revisions a
  length stays under the 0.1 asked (4.25 measured 0.06-0.16 in draws of 5000).
* ``threshold`` (0.05): the smallest relative step reported, however clear.
* ``floor`` (0.01): the smallest point noise assumed (relative: 1 %), so that revisions that
  happened to repeat exactly do not make every difference a step.
* ``clip`` (4.0) and ``single_runs`` (3): the outliers' rule above.
* ``beta`` (3.0): the candidates' penalty a step; the candidates only need to include the real
  steps (1.5 and 4.5 give the same F1, within 0.001).
* ``noise_factor`` (3.0): ``differs_beyond_noise`` only (bisect): a change between two
  revisions must exceed this many run-to-run standard deviations.

**Measured** (``bench/steps.py``, seed 1, side by side with asv, Apache Otava's and MongoDB's
E-Divisive and ruptures' PELT): F1 0.96 / 0.98 / 0.97 / 0.99 / 0.99 at 10 / 30 / 100 / 300 /
1000 revisions, the best of the others 0.93 (Otava) / 0.92 (MongoDB) / 0.90 (ruptures) / 0.90
(ruptures) / 0.91 (MongoDB); false steps per 100 revisions of flat series 0.04 at most (1000
revisions), 0.018 over all lengths, the others' 0.23-1.0. This module's former detector
(weighted L1, at most 7 steps, O(m^3)) reached 0.92-0.95 / 0.85-0.91 / 0.74 at 10 / 30 / 100
revisions with 0.2-0.45 false steps per 100, and took seconds a series from 300 revisions on.
Shorter histories: flat series of 3 / 5 / 7 revisions (the same noise) give 0.005 / 0.05 /
0.04 false steps per 100 revisions; a 2x step in the middle of 5 revisions is found at its
commit in 96 % of series, a 1.2x one in 69 %; of 3 revisions in 51 % and 32 % (a revision
alone at an end needs ``single_runs`` runs). Drift larger than the simulation's (as large as
the runs' noise itself, rho 0.5, 3 runs at 5 %) gives a false step in 1.0 % of series of 12
revisions and 1.8 % of 30.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2, norm
from scipy.stats import t as student_t

# the method's name and version: steps kept by what they were found in (reports.history) are
# found again once it changes
METHOD = "PELT candidates, REML AR(1) drift + white noise, pairwise GLS judgement, v3"
MAD_TO_SD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation
# var(median of n runs) / var(mean of n runs) for normal runs; pi / 2 beyond
MEDIAN_VARIANCE = {1: 1.0, 2: 1.0, 3: 1.35, 4: 1.19, 5: 1.43}
RHO_START = 0.5  # the first pass's drift correlation, before any estimate
FIRST = 0.6  # the first pass's share of the penalty and of the significance
QUANTILE = 0.975  # the significance is raised by t's / the normal's quantile here
# the noise model's grid (restricted maximum likelihood): rho; e and d in units of the runs'
# variance (or, with one run a revision, of the neighbouring differences' robust variance)
RHO_GRID = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
WHITE_FROM_RUNS = np.array([0.6, 0.8, 1.0, 1.25, 1.6])
WHITE_FREE = np.array([0.0, 0.1, 0.2, 0.35, 0.5, 0.7, 1.0, 1.4])
DRIFT_GRID = np.array([0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0,
                       13.0, 20.0, 40.0, 100.0, 300.0, 1000.0])


@dataclass(frozen=True)
class StepParams:
    significance: float = 4.5
    threshold: float = 0.05
    floor: float = 0.01
    clip: float = 4.0
    single_runs: int = 3
    beta: float = 3.0
    noise_factor: float = 3.0


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
class Noise:
    white: float  # e: the variance of a point's own noise
    drift: float  # d: the variance of the AR(1) drift between revisions
    rho: float  # the drift's correlation from one revision to the next
    white_dof: float  # the degrees of freedom of the estimates of e and d; 0: e shares d's
    drift_dof: float  # (no runs to tell them apart: both from the same points)


def robust_sd(values: Sequence[float]) -> float | None:
    """1.4826 x the median absolute deviation: a standard deviation one outlier cannot inflate."""
    if len(values) < 2:
        return None
    array = np.asarray(values, dtype=float)
    return float(MAD_TO_SD * np.median(np.abs(array - np.median(array))))


def detect_steps(points: Sequence[Sequence[float]],
                 params: StepParams = DEFAULT_PARAMS) -> list[Step]:
    """The steps of a series: ``points[i]`` holds the values of the runs at revision ``i``
    (commit order); points without values are skipped by the caller. See the module's text."""
    if any(not values for values in points):
        raise ValueError("every point needs at least one value")
    m = len(points)
    if m < 2:
        return []
    positive = all(v > 0 for values in points for v in values)
    x, own, white_runs, runs_dof = _points(points, positive)
    floor = params.floor if positive else params.floor * max(float(np.median(np.abs(x))), 1e-12)
    alone = np.asarray([len(values) >= params.single_runs for values in points])
    x = _despike(x, alone, params.clip, floor)
    # the first estimate: e from the runs, d from the differences of neighbours (if enough)
    near = _mad0(np.diff(x)) ** 2 / 2.0
    white = white_runs if white_runs else near
    drift = max(near - white, 0.0) / (1.0 - RHO_START) if m > 5 else 0.0
    noise = Noise(white, drift, RHO_START, runs_dof, m - 1.0)
    bounds: list[int] = []
    for share in (FIRST, 1.0):
        noise = _floored(noise, floor)
        proposed = _partition(x, noise.white + noise.drift,
                              share * share * params.beta * math.log(m), alone)
        bounds = _prune(x, proposed, noise, own, positive, params, share * params.significance)
        noise = _reml(x, bounds, white_runs, runs_dof, near) or noise
    bounds = _prune(x, bounds, _floored(noise, floor), own, positive, params,
                    params.significance)
    edges = [0, *bounds, m]
    levels = [float(np.mean(x[a:b])) for a, b in zip(edges, edges[1:], strict=False)]
    unscale = math.exp if positive else float
    return [Step(b, unscale(levels[r]), unscale(levels[r + 1])) for r, b in enumerate(bounds)]


def _points(points: Sequence[Sequence[float]], positive: bool
            ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """x (the medians on the fitted scale), each point's own variance of its median (0 when
    run once), the runs' white variance of a median (pooled) and its degrees of freedom."""
    m = len(points)
    x, own = np.zeros(m), np.zeros(m)
    by_count: dict[int, list[int]] = {}
    for i, values in enumerate(points):
        by_count.setdefault(len(values), []).append(i)
    pooled, counts = [], []
    for n, rows in by_count.items():
        values = np.asarray([points[i] for i in rows], dtype=float)
        if positive:
            values = np.log(values)
        x[rows] = np.median(values, axis=1)
        if n > 1:
            variance = np.var(values, axis=1, ddof=1) * MEDIAN_VARIANCE.get(n, math.pi / 2) / n
            own[rows] = variance
            pooled.extend(variance)
            counts.extend([n] * len(rows))
    if not pooled:
        return x, own, 0.0, 0.0
    k = int(np.median(counts)) - 1  # the median of chi2_k / k is below 1: unbias it
    return (x, own, float(np.median(pooled)) * k / float(chi2.median(k)),
            float(sum(n - 1 for n in counts)))


def _mad0(values: np.ndarray) -> float:
    """1.4826 median |v|: the robust sd of differences (centred on 0 by construction)."""
    return float(MAD_TO_SD * np.median(np.abs(values))) if len(values) else 0.0


def _floored(noise: Noise, floor: float) -> Noise:
    if noise.white + noise.drift >= floor * floor:
        return noise
    return Noise(floor * floor - noise.drift, noise.drift, noise.rho, noise.white_dof,
                 noise.drift_dof)


def _despike(x: np.ndarray, alone: np.ndarray, clip: float, floor: float) -> np.ndarray:
    """Outlying points set to their nearer neighbour's value: one point, or two neighbouring
    points inside the series, that may not stand alone, all beyond ``clip`` robust sds of the
    points on both sides of them (at an end: of the two next to it), on the same side; the
    farthest first (so that a point between two spikes is not taken for one)."""
    m = len(x)
    out = x.copy()
    limit = clip * max(_mad0(np.diff(x)) / math.sqrt(2.0), floor)
    while True:
        best = (limit, 0, 0)
        for width in (1, 2):
            if m < width + 2:
                continue
            count = m - width + 1
            starts = np.arange(count)
            ends = starts + width
            low, high, trusted = out[:count].copy(), out[:count].copy(), alone[:count].copy()
            for k in range(1, width):
                low = np.minimum(low, out[k:count + k])
                high = np.maximum(high, out[k:count + k])
                trusted |= alone[k:count + k]
            left = np.where(starts > 0, out[np.maximum(starts - 1, 0)],
                            out[np.minimum(ends + 1, m - 1)])
            right = np.where(ends < m, out[np.minimum(ends, m - 1)],
                             out[np.maximum(starts - 2, 0)])
            depth = np.maximum(low - np.maximum(left, right), np.minimum(left, right) - high)
            depth[trusted] = -np.inf
            if width > 1:  # two points at an end may be the first of a new level
                depth[[0, -1]] = -np.inf
            i = int(np.argmax(depth))
            if depth[i] > best[0]:
                best = (float(depth[i]), i, i + width)
        _, i, j = best
        if j == 0:
            return out
        before = out[i - 1] if i > 0 else out[j]
        after = out[j] if j < m else out[i - 1]
        for k in range(i, j):
            out[k] = before if abs(out[k] - before) <= abs(out[k] - after) else after


def _partition(x: np.ndarray, scale: float, penalty: float, alone: np.ndarray) -> list[int]:
    """Optimal partitioning with PELT's pruning: sum of squares / scale + penalty a step; a
    point that may not stand alone is no segment of its own."""
    m = len(x)
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])
    best = np.full(m + 1, np.inf)
    best[0] = -penalty
    back = np.zeros(m + 1, dtype=int)
    starts = np.array([0])
    for t in range(1, m + 1):
        n = t - starts
        cost = (s2[t] - s2[starts] - (s1[t] - s1[starts]) ** 2 / n) / scale
        if not alone[t - 1]:
            cost = np.where(n == 1, np.inf, cost)
        total = best[starts] + cost + penalty
        k = int(np.argmin(total))
        best[t], back[t] = total[k], starts[k]
        keep = (best[starts] + cost <= best[t]) | (n == 1)  # PELT: never better again
        starts = np.append(starts[keep], t)
    bounds, t = [], m
    while t > 0:
        t = int(back[t])
        if t > 0:
            bounds.append(t)
    return sorted(bounds)


def _whiten(columns: np.ndarray, noise: Noise, own: np.ndarray) -> np.ndarray:
    """L^-1 columns, L L^T the noise's covariance (``own`` added to the white variance):
    the Kalman filter's standardised innovations, O(m) a column."""
    out = np.empty_like(columns)
    wander = np.zeros(columns.shape[1])
    p, rho = noise.drift, noise.rho
    q = noise.drift * (1.0 - rho * rho)
    for t in range(columns.shape[0]):
        f = max(p + noise.white + own[t], 1e-300)
        v = columns[t] - wander
        out[t] = v / math.sqrt(f)
        gain = p / f
        wander = rho * (wander + gain * v)
        p = rho * rho * p * (1.0 - gain) + q
    return out


def _mean_variance(n: np.ndarray, noise: Noise) -> tuple[np.ndarray, np.ndarray]:
    """The white and the drift part of the variance of the mean of n neighbouring points."""
    n = n.astype(float)
    rho = noise.rho
    if rho == 0.0:
        return noise.white / n, noise.drift / n
    pairs = rho * (n * (1.0 - rho) - (1.0 - rho ** n)) / (1.0 - rho) ** 2  # sum (n-k) rho^k
    return noise.white / n, noise.drift * (n + 2.0 * pairs) / (n * n)


def _prune(x: np.ndarray, bounds: list[int], noise: Noise, own: np.ndarray, positive: bool,
           params: StepParams, significance: float) -> list[int]:
    """Drop the steps that are not beyond noise, the weakest first, until every one left is.
    A step's size is estimated by generalised least squares from the two segments it
    separates; dropping one changes only its two neighbours' (O(m) a drop, O(m^2) at most)."""
    m = len(x)
    bounds = sorted(bounds)
    edges = [0, *bounds, m]
    judged = [_judge(x, edges[r], edges[r + 1], edges[r + 2], noise, own, positive, params,
                     significance) for r in range(len(bounds))]
    while bounds:
        failing = [r for r, (_, ok) in enumerate(judged) if not ok]
        if not failing:
            break
        worst = min(failing, key=lambda r: judged[r][0])
        del bounds[worst], judged[worst], edges[worst + 1]
        for r in (worst - 1, worst):
            if 0 <= r < len(bounds):
                judged[r] = _judge(x, edges[r], edges[r + 1], edges[r + 2], noise, own,
                                   positive, params, significance)
    return bounds


def _judge(x: np.ndarray, a: int, b: int, c: int, noise: Noise, own: np.ndarray,
           positive: bool, params: StepParams, significance: float) -> tuple[float, bool]:
    """(score, beyond noise) of the step at b between the segments a..b-1 and b..c-1: its
    GLS size in standard errors, and whether that and its ratio pass."""
    n = c - a
    extra = np.zeros(n)
    if b - a == 1:  # a point alone adds its own runs' variance
        extra[0] = own[a]
    if c - b == 1:
        extra[n - 1] = own[b]
    columns = np.zeros((n, 3))
    columns[:, 0], columns[:, 1], columns[b - a:, 2] = x[a:c], 1.0, 1.0
    white = _whiten(columns, noise, extra)
    design = white[:, 1:]
    info = np.linalg.pinv(design.T @ design)
    size = float((info @ (design.T @ white[:, 0]))[1])
    score = abs(size) / math.sqrt(max(float(info[1, 1]), 1e-300))
    before, after = float(np.mean(x[a:b])), float(np.mean(x[b:c]))
    if positive:  # the larger of the ratio and its inverse: a drop to 1/4 is a 4x step
        relative = math.expm1(abs(after - before))
    else:
        relative = abs(after / before - 1.0) if before else math.inf
    white_part, drift_part = _mean_variance(np.asarray([b - a, c - b]), noise)
    white_sum, drift_sum = float(white_part.sum()), float(drift_part.sum())
    if noise.white_dof:  # Satterthwaite's degrees of freedom of the sum
        dof = (white_sum + drift_sum) ** 2 / max(
            white_sum ** 2 / noise.white_dof + drift_sum ** 2 / noise.drift_dof, 1e-300)
    else:
        dof = noise.drift_dof
    limit = significance * float(student_t.ppf(QUANTILE, max(dof, 0.5))) / norm.ppf(QUANTILE)
    return score, relative > params.threshold and score > limit


def _reml(x: np.ndarray, bounds: list[int], white_runs: float, runs_dof: float,
          near: float) -> Noise | None:
    """The noise by restricted maximum likelihood, every segment its own level: a Kalman
    filter over the series (a diffuse level restarted at each step, the AR(1) drift, the
    white noise), vectorised over the grid of (rho, e, d); the runs' variance, when there
    is one, enters as a chi-square observation of e. None when no point is left over."""
    m = len(x)
    inner = m - len(bounds) - 1  # the points beyond the segments' levels
    reference = white_runs if white_runs > 0 else near
    if inner < 1 or reference <= 0:
        return None
    first = np.zeros(m, dtype=bool)
    first[[0, *bounds]] = True
    whites = WHITE_FROM_RUNS if white_runs > 0 else WHITE_FREE
    rho, white, drift = (a.ravel() for a in np.meshgrid(RHO_GRID, whites, DRIFT_GRID,
                                                       indexing="ij"))
    y = (x - float(np.median(x))) / math.sqrt(reference)
    diffuse = 1e6 * max(1.0, float(np.max(y * y)))
    q = (1.0 - rho * rho) * drift
    size = len(rho)
    level, wander = np.zeros(size), np.zeros(size)
    p11, p12, p22 = np.zeros(size), np.zeros(size), np.zeros(size)
    total = np.zeros(size)
    for t in range(m):
        if first[t]:
            level[:], wander[:], p11[:], p12[:] = 0.0, 0.0, diffuse, 0.0
            p22 = drift.copy()
        else:
            wander = rho * wander
            p22 = rho * rho * p22 + q
            p12 = rho * p12
        v = y[t] - level - wander
        f = np.maximum(p11 + 2.0 * p12 + p22 + white, 1e-12)
        if not first[t]:
            total += np.log(f) + v * v / f
        k1, k2 = (p11 + p12) / f, (p12 + p22) / f
        level, wander = level + k1 * v, wander + k2 * v
        p11, p12, p22 = p11 - k1 * k1 * f, p12 - k1 * k2 * f, p22 - k2 * k2 * f
    if white_runs > 0:
        total += runs_dof * (np.log(white) + 1.0 / white)
    i = int(np.argmin(total))
    return Noise(float(white[i]) * reference, float(drift[i]) * reference, float(rho[i]),
                 runs_dof if white_runs > 0 else 0.0, float(max(inner - 1, 1)))


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
