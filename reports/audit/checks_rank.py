"""Key-ranking claims (seed 004's predictor metrics): a policy's Spearman rho, top-32 recall,
mass captured by the top 32 or mass lost at 50 % eviction, as lmc measured them on the run
(``lmc ppl --measure-keys``: the ``rank_<field>`` columns of reports.runs), the median over
the runs of ``a``; with ``b``, the mean over the inputs (windows) both ran of b's figure less
a's. The noise is the 95 % interval of the mean over the windows (the independent repeats).
"""

from __future__ import annotations

import pandas as pd

from reports.audit.claims_file import Claim
from reports.audit.evidence import (
    Measurement,
    describe,
    ok_runs,
    paired_margin,
    paired_mean,
    pairs,
    run_ids,
    select,
)


def _ranked(runs: pd.DataFrame, selector: dict, column: str) -> pd.DataFrame:
    chosen = ok_runs(select(runs, selector))
    return chosen[chosen[column].notna()]


def key_rank(claim: Claim, runs: pd.DataFrame) -> Measurement:
    column = f"rank_{claim.measure.field}"
    a = _ranked(runs, claim.measure.a, column)
    if a.empty:
        return Measurement(reason=f"no successful runs with key-ranking figures for "
                                  f"{describe(claim.measure.a)} (a ppl spec with "
                                  "engine.measure_keys and an evicting policy measures them)")
    value = float(a[column].median())
    if not claim.measure.b:
        return Measurement(value=value, text=f"{value:.3g}", evidence=run_ids(a),
                           detail=f"{claim.measure.field}, median over {len(a)} runs",
                           noise=paired_margin(a[column].tolist()))
    b = _ranked(runs, claim.measure.b, column)
    if b.empty:
        return Measurement(reason=f"no successful runs with key-ranking figures for "
                                  f"{describe(claim.measure.b)}")
    other = float(b[column].median())
    diffs = [y - x for x, y in pairs(a, b, column)]
    if not diffs:
        return Measurement(reason="the two policies were never ranked on the same windows")
    return paired_mean(diffs, run_ids(a, b),
                       f"{claim.measure.field} median {other:.3g} ({describe(claim.measure.b)}) "
                       f"vs {value:.3g} ({describe(claim.measure.a)}); per-window differences "
                       + ", ".join(f"{d:+.3f}" for d in diffs))
