"""The prefill importance recomputed from lmc's own inputs (``--dump-importance``), to check the
block-selection article's claim that what is recorded is what ran: exact when the prefill is
exact, sparse when it is sparse.

Layer 0's importance is recomputed in float64 numpy from the dumped post-RoPE queries and keys,
each query head over its KV head (head h reads KV head h // (heads / kv_heads), as lmc's GQA
does), scores q.k / sqrt(head_dim), softmax over what the query saw, summed over queries and
heads: either every position up to the query's own (exact causal attention), or only the
positions of the blocks the sparse prefill's dump says it attended, up to its own (softmax
renormalised over them). Layer 0's inputs are the embeddings alone, so an exact and a sparse
prefill of one prompt dump the same queries and keys: each readout can be set against both
recomputes. The engine check that runs lmc is harness.verify.importance_check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reports.audit.importance_dump import ImportanceDump
from reports.errors import ReportInputError


def recompute_importance(dump: ImportanceDump, blocks: list[list[tuple[int, ...]]] | None
                         ) -> np.ndarray:
    """Layer 0's prefill importance (float64, one value per position) from the dump's queries
    and keys: exact causal attention (``blocks`` None) or attention restricted to ``blocks``
    ([position][head] -> the block ids that query and head attended)."""
    n, heads, dim = dump.q.shape
    group = heads // dump.k.shape[1]
    positions = np.arange(n)
    causal = positions[None, :] <= positions[:, None]  # [query][key]
    importance = np.zeros(n)
    for h in range(heads):
        seen = causal.copy()
        if blocks is not None:
            chosen = np.zeros((n, (n + dump.block - 1) // dump.block), dtype=bool)
            for t in range(n):
                chosen[t, list(blocks[t][h])] = True
            seen &= chosen[:, positions // dump.block]
        keys = dump.k[:, h // group].astype(np.float64)
        scores = dump.q[:, h].astype(np.float64) @ keys.T / math.sqrt(dim)
        scores = np.where(seen, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        importance += (weights / weights.sum(axis=1, keepdims=True)).sum(axis=0)
    return importance


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """sum |got - want| / sum |want| over the positions (the importance's total is
    queries x heads, so this is the share of that mass placed differently)."""
    return float(np.abs(got.astype(np.float64) - want).sum() / np.abs(want).sum())


@dataclass(frozen=True)
class ImportanceFigures:
    """One prompt's readouts against the recomputes: ``own[mode]`` is the relative error of the
    readout of a ``mode`` prefill against the recompute of that mode, ``other[mode]`` against
    the other mode's; ``separation`` is how far the two recomputes are apart (the smallest
    error a readout of the wrong mode can have, up to its own error)."""

    own: dict[str, float]
    other: dict[str, float]
    separation: float
    positions: int


def importance_figures(exact: ImportanceDump, sparse: ImportanceDump) -> ImportanceFigures:
    """The figures of one prompt's exact and sparse prefill dumps (same prompt, same model)."""
    if exact.prefill != "exact" or sparse.prefill != "sparse":
        raise ReportInputError(f"importance dumps of prefill {exact.prefill} and "
                               f"{sparse.prefill}, expected exact and sparse")
    if not (np.array_equal(exact.q, sparse.q) and np.array_equal(exact.k, sparse.k)):
        raise ReportInputError("the exact and sparse prefills' layer-0 queries or keys differ: "
                               "not dumps of one prompt on one model")
    recomputed = {"exact": recompute_importance(exact, None),
                  "sparse": recompute_importance(sparse, sparse.blocks)}
    readout = {"exact": exact.importance[0], "sparse": sparse.importance[0]}
    swap = {"exact": "sparse", "sparse": "exact"}
    return ImportanceFigures(
        own={m: relative_error(readout[m], recomputed[m]) for m in readout},
        other={m: relative_error(readout[m], recomputed[swap[m]]) for m in readout},
        separation=relative_error(recomputed["sparse"], recomputed["exact"]),
        positions=exact.positions)
