"""Identity claims: two configs generate byte-identical tokens on the same prompts."""

from __future__ import annotations

import pandas as pd

from reports.audit.claims_file import Claim
from reports.audit.evidence import Measurement, describe, ok_runs, run_ids, select
from reports.runs import first_divergence
from reports.runs import generated_tokens as tokens

PROMPT_KEYS = ["device", "kind", "ctx", "depth", "seed", "length", "repeat"]


def identical_tokens(claim: Claim, runs: pd.DataFrame) -> Measurement:
    """The fraction of prompts (same device, prompt and repeat) where a and b agree exactly."""
    a = ok_runs(select(runs, claim.measure.a))
    b = ok_runs(select(runs, claim.measure.b))
    if a.empty or b.empty:
        return Measurement(reason=f"no successful runs for {describe(claim.measure.a)} and "
                                  f"{describe(claim.measure.b)} to compare")
    pairs = a.merge(b, on=PROMPT_KEYS, suffixes=("_a", "_b"))
    if pairs.empty:
        return Measurement(reason="the two configs were never run on the same prompts")
    same, divergent = 0, []
    for row in pairs.itertuples():
        ta, tb = tokens(row.generated_ids_a), tokens(row.generated_ids_b)
        step = first_divergence(ta or [], tb or [])
        if step is None and ta is not None:
            same += 1
        else:
            divergent.append(f"runs {row.run_id_a}/{row.run_id_b} diverge at step {step}")
    value = same / len(pairs)
    detail = f"{same} of {len(pairs)} prompts identical"
    if divergent:
        detail += "; " + "; ".join(divergent[:3]) + ("; ..." if len(divergent) > 3 else "")
    return Measurement(value=value, text=f"{value:.3g} ({same}/{len(pairs)} identical)",
                       evidence=run_ids(pairs.rename(columns={"run_id_a": "run_id"}),
                                        pairs.rename(columns={"run_id_b": "run_id"})),
                       detail=detail)
