"""The block-selection article's rule, written here from its text, and inputs that make each
of its steps decide the outcome: the audit's ``selection_rule`` check runs lmc attn-bench
(sparse, ``--trace-selection``) on such inputs and compares the blocks lmc selected for every
head with what the rule selects.

The rule (shared/seeds/README.md, seed 000): probe each block by the max of q.k over keys at
the stride ``max(1, (end - start) // n_probe)``; reserve ``(k + 1) // 2`` blocks by prefill
importance (block sums), ties to the lower index; fill the rest of k by probe score, ties to
the lower index, stopping when no block is left; keep the last block, in place of the
lowest-scoring probe pick (importance picks are never replaced).

Scenarios (``measure.params.scenario``), each decided by one step:
- ``ties``: every key zero and every position equally important, so every choice is a tie;
- ``budget``: three blocks clearly most important, the probes preferring others, k = 5: the
  reservation's size decides how many of them are kept;
- ``recency``: as ``budget``, with the last block least important and least probed;
- ``importance-kept``: k = 3 with the last block least of all: recency must replace the probe
  pick, never an importance pick;
- ``few-blocks``: fewer blocks than k: every block, and no more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BLOCK, PROBES = 32, 8


@dataclass(frozen=True)
class Inputs:
    """One decode query per head over ``ctx`` positions (attn-bench --inputs' layout)."""

    q: np.ndarray  # [heads][dim]
    k: np.ndarray  # [ctx][kv_heads][dim]
    v: np.ndarray  # [ctx][kv_heads][dim]
    importance: np.ndarray  # [ctx]
    budget: int  # k, the blocks each head selects

    def bytes(self) -> bytes:
        return b"".join(a.astype("<f4").tobytes() for a in (self.q, self.k, self.v,
                                                            self.importance))


def article_selection(q: np.ndarray, keys: np.ndarray, importance: np.ndarray,
                      budget: int) -> list[int]:
    """The blocks the article's rule selects for one head (``keys``: its KV head's [ctx][dim]),
    ascending."""
    ctx = len(keys)
    n_blocks = math.ceil(ctx / BLOCK)
    probe, mass = [], []
    for b in range(n_blocks):
        start, end = b * BLOCK, min((b + 1) * BLOCK, ctx)
        step = max(1, (end - start) // PROBES)
        probe.append(max(float(q.astype(np.float64) @ keys[p].astype(np.float64))
                         for p in range(start, end, step)))
        mass.append(float(importance[start:end].astype(np.float64).sum()))
    chosen: list[int] = []

    def take(scores: list[float], want: int) -> None:
        for _ in range(want):
            left = [b for b in range(n_blocks) if b not in chosen]
            if not left:
                return
            chosen.append(max(left, key=lambda b: (scores[b], -b)))  # ties: lower index

    take(mass, (budget + 1) // 2)
    reserved = len(chosen)
    take(probe, budget - reserved)
    last = n_blocks - 1
    if last not in chosen and len(chosen) > reserved:
        chosen[-1] = last  # the last probe pick is the lowest-scoring one
    return sorted(chosen)


def scenario(name: str, seed: int, heads: int = 2, kv_heads: int = 1,
             dim: int = 16) -> Inputs:
    """The inputs of a scenario (see the module); ``seed`` varies what does not decide it."""
    rng = np.random.default_rng(seed)
    if name == "ties":
        ctx = 10 * BLOCK + 7  # a partial last block: off the block boundary
        return _inputs(rng.uniform(-1, 1, (heads, dim)), np.zeros((ctx, kv_heads, dim)), rng,
                       np.ones(ctx), 5)
    if name == "few-blocks":
        ctx = 3 * BLOCK + 11
        return _inputs(rng.uniform(-1, 1, (heads, dim)), rng.uniform(-1, 1, (ctx, kv_heads, dim)),
                       rng, rng.uniform(0, 1, ctx), 8)
    if name not in ("budget", "recency", "importance-kept"):
        raise ValueError(f"unknown selection scenario {name!r}")
    ctx = 11 * BLOCK + 5
    n_blocks = math.ceil(ctx / BLOCK)
    # the probes: q.k about 0.9, 0.8, 0.7, 0.6 on blocks 0, 2, 4, 6, 0.05 elsewhere, -0.9 on the
    # last block; importance: blocks 1, 3, 5 clearly first, the last block least
    probe_level = np.full(n_blocks, 0.05)
    probe_level[[0, 2, 4, 6]] = [0.9, 0.8, 0.7, 0.6]
    probe_level[-1] = -0.9
    imp_level = np.full(n_blocks, 0.1)
    imp_level[[1, 3, 5]] = [0.9, 0.8, 0.7]
    imp_level[-1] = 0.01
    u = rng.uniform(-1, 1, dim)
    q = np.repeat(u[None, :], heads, axis=0)  # every head queries along u
    k = rng.uniform(-1e-3, 1e-3, (ctx, kv_heads, dim))
    importance = np.empty(ctx)
    for b in range(n_blocks):
        rows = slice(b * BLOCK, min((b + 1) * BLOCK, ctx))
        k[rows] += probe_level[b] * u / float(u @ u)  # q.k = the block's level
        importance[rows] = imp_level[b] + rng.uniform(0, 1e-3, rows.stop - rows.start)
    return _inputs(q, k, rng, importance, 3 if name == "importance-kept" else 5)


def _inputs(q: np.ndarray, k: np.ndarray, rng: np.random.Generator, importance: np.ndarray,
            budget: int) -> Inputs:
    v = rng.uniform(-1, 1, k.shape)
    return Inputs(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                  importance.astype(np.float32), budget)


def traced_selections(trace: str) -> dict[int, list[int]]:
    """head -> its selected blocks, ascending, from an attn-bench selection trace (one step)."""
    chosen = {}
    for line in trace.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        _, _layer, head, _count, *blocks = line.split()
        chosen[int(head)] = sorted(int(b) for b in blocks)
    return chosen
