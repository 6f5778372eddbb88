"""Every metric a claim may name and how it is measured: the one list of them.

The claims file takes the names a ``[[claim]]`` may give from here (in this order: its error
lists them so), and the verdicts the check of each; neither writes the list again. A check
lives in the module of its family (``checks_identity``, ``checks_softmax`` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from reports.audit import (
    checks_identity,
    checks_llamabench,
    checks_ppl,
    checks_rank,
    checks_recall,
    checks_softmax,
    checks_timing,
    checks_trees,
)
from reports.audit.claim import Claim
from reports.audit.evidence import Reading

# a metric's check: the claim and its runs (empty for a computed metric) -> what it measured
Check = Callable[[Claim, pd.DataFrame], Reading]
LLAMA_BENCH_TPS = "llama_bench_tps"  # the metric of a [[llama_bench]] row (no [[claim]] names it)


@dataclass(frozen=True)
class MetricCheck:
    """How one metric is measured."""

    # None where reports has no check: the engine checks the harness runs (reports does not
    # run lmc: harness.verify.engine_checks) and "reported" (a figure quoted, not measured)
    check: Check | None = None
    computed: bool = False  # measured without runs, so without an experiment: measure.params


CHECKS: dict[str, MetricCheck] = {
    "identical_tokens": MetricCheck(checks_identity.identical_tokens),
    "identical_traces": MetricCheck(checks_identity.identical_traces),
    "trace_shared_blocks": MetricCheck(checks_identity.trace_shared_blocks),
    "trace_tail_share": MetricCheck(checks_identity.trace_tail_share),
    "repetition": MetricCheck(checks_identity.repetition),
    "critical_k": MetricCheck(checks_recall.critical_k),
    # float32 arithmetic in numpy, here
    "exp_overflow": MetricCheck(checks_softmax.exp_overflow, computed=True),
    "dot_growth": MetricCheck(checks_softmax.dot_growth, computed=True),
    "dot_magnitude": MetricCheck(checks_softmax.dot_magnitude, computed=True),
    "softmax_overflow": MetricCheck(checks_softmax.softmax_overflow, computed=True),
    "quotient": MetricCheck(checks_softmax.quotient, computed=True),
    # the learned predictor's tree file, read here
    "split_share": MetricCheck(checks_trees.split_share, computed=True),
    # the engine run directly, by the harness
    "reference_error": MetricCheck(computed=True),
    "causal_prefix": MetricCheck(computed=True),
    "selection_rule": MetricCheck(computed=True),
    "renormalised_error": MetricCheck(computed=True),
    "prefill_importance": MetricCheck(computed=True),
    "recall": MetricCheck(checks_recall.recall),
    "time": MetricCheck(checks_timing.time),
    "time_ratio": MetricCheck(checks_timing.time_ratio),
    "ppl": MetricCheck(checks_ppl.ppl),
    "ppl_change": MetricCheck(checks_ppl.ppl_change),
    "key_rank": MetricCheck(checks_rank.key_rank),
    "reported": MetricCheck(),
    LLAMA_BENCH_TPS: MetricCheck(checks_llamabench.tokens_per_second),
}
COMPUTED_METRICS = tuple(name for name, metric in CHECKS.items() if metric.computed)
# the computed metrics whose check the harness provides (it runs lmc on this machine)
ENGINE_METRICS = tuple(name for name in COMPUTED_METRICS if CHECKS[name].check is None)
