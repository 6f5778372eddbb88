"""The KV eviction tables of a report (the eviction-prediction article's study): perplexity under
eviction (lmc --kv-budget) and the ranking figures of each policy's keep score (lmc --measure-keys),
from the flattened runs (reports.runs.flatten_runs: its ``kv_budget`` and ``rank_<metric>``
columns)."""

from __future__ import annotations

import pandas as pd

from reports.cells import cell_rows, group_cells, sorted_table
from reports.runs import RANK_METRICS
from reports.stats import series_median


def eviction_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Perplexity under eviction (lmc --kv-budget) per (device, length, policy, kv_budget): the
    median over texts, and its cost against the median of exact attention on the same device and
    length, in percent."""
    ok = runs[(runs["status"] == "ok") & runs["ppl"].notna()]
    keys = ["device", "length", "policy", "kv_budget"]
    rows = []
    for key, cell in group_cells(ok[ok["kv_budget"].notna()], keys):
        exact = ok[(ok["policy"] == "exact") & (ok["device"] == key[0])
                   & (ok["length"] == key[1])]["ppl"]
        ppl = float(cell["ppl"].median())
        rows.append(dict(zip(keys, key, strict=True)) | {
            "ppl": ppl, "exact_ppl": exact.median() if len(exact) else None,
            "ppl_vs_exact_pct": (ppl / float(exact.median()) - 1.0) * 100.0 if len(exact)
            else None, "n": len(cell)})
    columns = keys + ["ppl", "exact_ppl", "ppl_vs_exact_pct", "n"]
    return sorted_table(pd.DataFrame(rows, columns=columns), keys)


def key_rank_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The eviction-prediction article's key-ranking figures (lmc --measure-keys) per (device,
    config, length): the median over runs (texts) of each run's mean over its measured queries and
    layers."""
    measured = runs[(runs["status"] == "ok") & runs["rank_rho"].notna()]
    keys = ["device", "config", "length"]
    figures = {name: measured[f"rank_{name}"].tolist() for name in RANK_METRICS}
    rows = [dict(zip(keys, key, strict=True))
            | {name: series_median(figures[name][i] for i in cell) for name in RANK_METRICS}
            | {"n": len(cell)}
            for key, cell in cell_rows(measured, keys)]
    return sorted_table(pd.DataFrame(rows, columns=keys + list(RANK_METRICS) + ["n"]), keys)
