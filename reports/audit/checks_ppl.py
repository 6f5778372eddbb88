"""Perplexity claims: a config's perplexity, or its change against another config in percent."""

from __future__ import annotations

import pandas as pd

from reports.audit.claims_file import Claim
from reports.audit.evidence import Measurement, describe, ok_runs, run_ids, select


def _ppl_runs(runs: pd.DataFrame, selector: dict) -> pd.DataFrame:
    chosen = ok_runs(select(runs, selector))
    return chosen[chosen["ppl"].notna()]


def ppl(claim: Claim, runs: pd.DataFrame) -> Measurement:
    chosen = _ppl_runs(runs, claim.measure.a)
    if chosen.empty:
        return Measurement(reason=f"no successful ppl runs for {describe(claim.measure.a)}")
    value = float(chosen["ppl"].median())
    return Measurement(value=value, text=f"{value:.4g}", evidence=run_ids(chosen),
                       detail=f"median over {len(chosen)} runs")


def ppl_change(claim: Claim, runs: pd.DataFrame) -> Measurement:
    """(ppl(b) / ppl(a) - 1) x 100: the perplexity cost of b over a, in percent."""
    a, b = _ppl_runs(runs, claim.measure.a), _ppl_runs(runs, claim.measure.b)
    if a.empty or b.empty:
        return Measurement(reason=f"no successful ppl runs for both {describe(claim.measure.a)} "
                                  f"and {describe(claim.measure.b)}")
    base, other = float(a["ppl"].median()), float(b["ppl"].median())
    value = (other / base - 1.0) * 100.0
    return Measurement(value=value, text=f"{value:+.3g} %", evidence=run_ids(a, b),
                       detail=f"ppl {other:.4g} vs {base:.4g}")
