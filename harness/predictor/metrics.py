"""The eviction-prediction article's metrics of a key ranking against the true attention mass,
per query and layer.

For one query at one layer with keys j and true masses m_j, a scorer gives scores s_j:

- ``rho``: Spearman rank correlation of s and m;
- ``recall32``: |top-32 by s ∩ top-32 by m| / 32;
- ``captured32``: the true mass inside the top-32 by s, over the total;
- ``lost50``: the true mass of the half with the lowest s (evicted at 50 %), over the total.

Queries with fewer than ``MIN_KEYS`` keys are left out (every key would be in the top 32).
Ties in s keep the lower key first (a stable sort), as the engine's block rankings do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import spearmanr

TOP = 32
MIN_KEYS = 2 * TOP
METRICS = ("rho", "recall32", "captured32", "lost50")


@dataclass
class RankScores:
    rho: float
    recall32: float
    captured32: float
    lost50: float
    queries: int

    def to_dict(self) -> dict:
        return asdict(self)


def query_scores(score: np.ndarray, mass: np.ndarray) -> tuple[float, float, float, float]:
    """The four metrics for one query's keys."""
    order = np.argsort(-score, kind="stable")
    true_top = np.argsort(-mass, kind="stable")[:TOP]
    total = float(mass.sum())
    recall = len(np.intersect1d(order[:TOP], true_top)) / TOP
    captured = float(mass[order[:TOP]].sum()) / total
    lost = float(mass[order[len(order) - len(order) // 2:]].sum()) / total
    if np.ptp(score) == 0 or np.ptp(mass) == 0:
        rho = 0.0  # a constant ranking carries no order
    else:
        rho = float(spearmanr(score, mass).statistic)
    return rho, recall, captured, lost


def group_bounds(keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of equal rows in ``keys`` (rows come grouped by query)."""
    change = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(keys)]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def rank_scores(score: np.ndarray, mass: np.ndarray, groups: list[tuple[int, int]]) -> RankScores:
    """Mean of the per-query metrics over the groups with at least MIN_KEYS keys."""
    rows = [query_scores(score[a:b], mass[a:b]) for a, b in groups if b - a >= MIN_KEYS]
    if not rows:
        return RankScores(float("nan"), float("nan"), float("nan"), float("nan"), 0)
    mean = np.mean(np.array(rows), axis=0)
    return RankScores(*(float(v) for v in mean), queries=len(rows))
