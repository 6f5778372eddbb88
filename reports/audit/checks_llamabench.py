"""Published llama-bench rows: the t/s of one llama-bench test, recomputed from stored samples.

Each llama-bench run stores every test it ran with its raw ``samples_ns`` (the run's outcome
``extra.llama_bench.tests``). A test's t/s is llama-bench's own figure, the mean over its
repetitions of tokens / seconds, recomputed here from those samples; a device's figure is the
median over its runs, and the claim is judged on the median over devices.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import Reading, describe, ok_runs, run_ids, select


def measured_tps(extra: Any, test: str) -> float | None:
    """The mean t/s over the repetitions of ``test`` in one run's stored llama-bench tests."""
    data = json.loads(extra) if isinstance(extra, str) else extra
    tests = ((data or {}).get("llama_bench") or {}).get("tests") or []
    for row in tests:
        if row.get("test") == test and row.get("samples_ns"):
            tokens = row["n_prompt"] if test.startswith("pp") else row["n_gen"]
            return statistics.fmean(tokens * 1e9 / ns for ns in row["samples_ns"])
    return None


def tokens_per_second(claim: Claim, runs: pd.DataFrame) -> Reading:
    test = claim.measure.field
    a = ok_runs(select(runs, claim.measure.a))
    figures = a.assign(tps=[measured_tps(extra, test) for extra in a["extra"]])
    figures = figures[figures["tps"].notna()]
    if figures.empty:
        return Reading(reason=f"no successful llama-bench run of {test} for "
                              f"{describe(claim.measure.a)}")
    medians = {device: float(cell["tps"].median()) for device, cell in figures.groupby("device")}
    value = statistics.median(medians.values())
    return Reading(value=value, text=f"{value:.4g} t/s", evidence=run_ids(figures),
                   detail="; ".join(f"{d}: {test} {m:.4g} t/s over "
                                    f"{int((figures['device'] == d).sum())} run(s)"
                                    for d, m in sorted(medians.items())))
