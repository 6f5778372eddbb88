"""Perplexity claims: a config's perplexity, or its change against another config in percent.

Both are judged only when the model predicts the text at all: ``model_guard`` makes the claim
"not comparable" when the model's exact-attention perplexity on the claim's workload is not far
below uniform guessing over its vocabulary (a model that cannot predict the text turns any
policy's perplexity change into noise).
"""

from __future__ import annotations

import json

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import (
    Reading,
    describe,
    ok_runs,
    paired_margin,
    paired_mean,
    pairs,
    run_ids,
    select,
)


def _ppl_runs(runs: pd.DataFrame, selector: dict) -> pd.DataFrame:
    chosen = ok_runs(select(runs, selector))
    return chosen[chosen["ppl"].notna()]


# Exact perplexity must be below this fraction of the vocabulary size (uniform guessing), i.e.
# the model's nll at least ln 10 = 2.3 nats below uniform, for its perplexity figures to count.
MAX_FRACTION_OF_UNIFORM = 0.1


def _vocab_size(raw_json: object) -> int | None:
    try:
        return int(json.loads(str(raw_json))["config"]["model_config"]["vocab_size"])
    except (ValueError, KeyError, TypeError):
        return None


def model_guard(measured: pd.DataFrame, runs: pd.DataFrame) -> str | None:
    """Why the perplexity of the models behind ``measured`` on their workloads means nothing,
    or None. ``runs`` is the whole experiment: the exact-attention runs on the same workloads and
    models are the reference, whether or not the claim measures them."""
    same = runs[runs["workload_id"].isin(set(measured["workload_id"]))
                & runs["model_id"].isin(set(measured["model_id"]))]
    exact = _ppl_runs(same, {"policy": ["exact"]})
    if exact.empty:
        return ("no successful exact-attention ppl run on the claim's workload, so whether the "
                "model predicts this text at all is unknown (add policy exact to the experiment)")
    vocab = {_vocab_size(raw) for raw in exact["raw_json"]} - {None}
    if not vocab:
        return "the exact-attention ppl runs do not record the model's vocabulary size"
    uniform = float(max(vocab))
    value = float(exact["ppl"].median())
    if value > MAX_FRACTION_OF_UNIFORM * uniform:
        return (f"the model does not predict this text: its exact-attention perplexity is "
                f"{value:.4g} against {uniform:.0f} for uniform guessing over its vocabulary "
                f"(must be below {MAX_FRACTION_OF_UNIFORM * uniform:.4g}), so perplexity "
                f"figures on it are noise; run a language model (models/pydoc-lm)")
    return None


def ppl(claim: Claim, runs: pd.DataFrame) -> Reading:
    chosen = _ppl_runs(runs, claim.measure.a)
    if chosen.empty:
        return Reading(reason=f"no successful ppl runs for {describe(claim.measure.a)}")
    value = float(chosen["ppl"].median())
    return Reading(value=value, text=f"{value:.4g}", evidence=run_ids(chosen),
                   detail=f"median over {len(chosen)} runs",
                   noise=paired_margin(chosen["ppl"].tolist()))


def ppl_change(claim: Claim, runs: pd.DataFrame) -> Reading:
    """(ppl(b) / ppl(a) - 1) x 100, the perplexity cost of b over a in percent: the mean over
    the inputs (windows) both ran of the per-window change; the noise is the 95 % interval of
    that mean (the windows are the independent repeats)."""
    a, b = _ppl_runs(runs, claim.measure.a), _ppl_runs(runs, claim.measure.b)
    if a.empty or b.empty:
        return Reading(reason=f"no successful ppl runs for both {describe(claim.measure.a)} "
                              f"and {describe(claim.measure.b)}")
    changes = [(y / x - 1.0) * 100.0 for x, y in pairs(a, b, "ppl")]
    if not changes:
        return Reading(reason="the two configs never ran on the same windows")
    per_window = ", ".join(f"{c:+.2f}" for c in changes)
    return paired_mean(changes, run_ids(a, b),
                       f"per-window changes {per_window} %; median ppl "
                       f"{float(b['ppl'].median()):.4g} vs {float(a['ppl'].median()):.4g}", " %")
