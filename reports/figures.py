"""The report's figures: report tables (``reports.aggregate``) drawn with ``reports.plots``.

Each function returns a list of (caption, svg) pairs in a stable order.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.plots import Axes, Series, heatmap, line_chart, stacked_bars

Figure = tuple[str, str]


def _num(value: object) -> float | None:
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    return None if math.isnan(number) else number


def _label(value: object) -> str:
    number = _num(value)
    if number is None:
        return "–"
    return f"{number:g}"


def needle_heatmaps(needle: pd.DataFrame) -> list[Figure]:
    """One context × depth recall grid per (config, device)."""
    figures = []
    cells: dict[tuple[str, str], list[int]] = {}  # groupby(sort=False): in order of first row
    devices, configs = needle["device"].tolist(), needle["config"].tolist()
    for i, (device, config) in enumerate(zip(devices, configs, strict=True)):
        if not (pd.isna(device) or pd.isna(config)):
            cells.setdefault((device, config), []).append(i)
    depth_of, ctx_of, recall_of = (needle[c].tolist() for c in ("depth", "ctx", "recall"))
    for (device, config), rows in cells.items():
        depths = sorted({float(depth_of[i]) for i in rows if not pd.isna(depth_of[i])})
        contexts = sorted({int(ctx_of[i]) for i in rows if not pd.isna(ctx_of[i])})
        first: dict[tuple[float, int], object] = {}  # (depth, ctx) -> its first row's recall
        for i in rows:
            if not (pd.isna(depth_of[i]) or pd.isna(ctx_of[i])):  # NaN matches no cell
                first.setdefault((float(depth_of[i]), int(ctx_of[i])), recall_of[i])
        values = [[_num(first[(depth, ctx)]) if (depth, ctx) in first else None
                   for ctx in contexts] for depth in depths]
        title = f"needle recall: {config} on {device}"
        svg = heatmap(title, [f"{d:g}" for d in depths], [str(c) for c in contexts], values,
                      row_title="depth", col_title="context length (tokens)")
        figures.append((title, svg))
    return figures


def _k_axis_series(cell: pd.DataFrame, column: str) -> list[Series]:
    """One series per non-exact policy over k; exact as a dashed horizontal reference line."""
    swept = cell[cell["policy"] != "exact"].dropna(subset=["k"])
    ks = sorted({int(k) for k in swept["k"]})
    series = []
    exact = cell[cell["policy"] == "exact"][column].dropna()
    if len(exact) and ks:
        value = float(exact.iloc[0])
        series.append(Series("exact", [(ks[0], value), (ks[-1], value)], dashed=True,
                             colour="#000000"))
    low, high = SPREAD.get(column, (None, None))
    for policy, group in swept.groupby("policy", sort=True):
        points = [(float(k), float(v)) for k, v in zip(group["k"], group[column], strict=True)
                  if _num(v) is not None]
        spread = [] if low is None else sorted(
            (float(k), float(lo), float(hi)) for k, lo, hi, n in zip(
                group["k"], group[low], group[high], group["n"], strict=True)
            if n > 1 and _num(lo) is not None and _num(hi) is not None)
        if points:
            series.append(Series(str(policy), sorted(points), spread=spread))
    return series


# a timing column of the k-sweep -> its min and max over runs (the charts' whiskers)
SPREAD = {"decode_ms": ("decode_min", "decode_max"), "attn_ms": ("attn_min", "attn_max")}


K_METRICS = [
    ("needle", "recall", "recall", Axes("k (blocks)", "recall", log_x=True, y_min=0, y_max=1)),
    ("needle", "same_as_exact", "tokens identical to exact",
     Axes("k (blocks)", "fraction of prompts", log_x=True, y_min=0, y_max=1)),
    ("needle", "decode_ms", "decode ms/token", Axes("k (blocks)", "ms/token", log_x=True)),
    ("needle", "attn_ms", "attention ms/token", Axes("k (blocks)", "ms/token", log_x=True)),
    ("decode", "decode_ms", "decode ms/token", Axes("k (blocks)", "ms/token", log_x=True)),
    ("decode", "attn_ms", "attention ms/token", Axes("k (blocks)", "ms/token", log_x=True)),
    ("ppl", "ppl", "perplexity", Axes("k (blocks)", "perplexity", log_x=True)),
    ("attn-bench", "attn_ms", "attention ms (one step)", Axes("k (blocks)", "ms", log_x=True)),
]


def k_sweep_charts(sweep: pd.DataFrame) -> list[Figure]:
    figures = []
    for kind, column, what, axes in K_METRICS:
        part = sweep[sweep["kind"] == kind]
        for (device, revision, size), cell in part.groupby(["device", "revision", "size"],
                                                           sort=True):
            if cell[cell["policy"] != "exact"]["k"].dropna().nunique() < 2:
                continue  # a sweep needs at least two values of k
            series = _k_axis_series(cell, column)
            if not series:
                continue
            unit = "length" if kind == "ppl" else "context"
            title = f"{what} vs k: {kind}, {unit} {_label(size)}, {device}"
            if revision:
                title += f", rev {revision}"
            if any(s.spread for s in series):
                title += " (whiskers: min-max over runs)"
            ks = sorted({int(k) for k in cell["k"].dropna()})
            chart_axes = Axes(axes.x_label, axes.y_label, axes.log_x, axes.y_min, axes.y_max,
                              x_ticks=[float(k) for k in ks])
            figures.append((title, line_chart(title, series, chart_axes)))
    return figures


def latency_charts(latency: pd.DataFrame) -> list[Figure]:
    """Per device: stacked bars (attention, rest) per context and config."""
    figures = []
    for device, cell in latency.groupby("device", sort=True):
        cell = cell.dropna(subset=["ctx"])
        if cell.empty or cell["attn_ms"].isna().all():
            continue
        groups = [str(int(c)) for c in sorted({int(c) for c in cell["ctx"]})]
        bars = sorted(set(cell["config"]), key=lambda c: (c != "exact" and not
                                                           c.startswith("exact "), c))
        values: dict[tuple[str, str, str], float] = {}
        spread: dict[tuple[str, str], tuple[float, float]] = {}
        for ctx, config, attn_ms, rest_ms, low, high, n in zip(*(cell[c].tolist() for c in (
                "ctx", "config", "attn_ms", "rest_ms", "decode_min", "decode_max", "n")),
                strict=True):
            group = str(int(ctx))
            values[(group, config, "attention")] = _num(attn_ms) or 0.0
            values[(group, config, "rest")] = max(0.0, _num(rest_ms) or 0.0)
            if n > 1 and _num(low) is not None and _num(high) is not None:
                spread[(group, config)] = (float(low), float(high))
        title = f"decode ms/token by context, attention vs rest: {device}"
        if spread:
            title += " (whiskers: min-max over runs)"
        figures.append((title, stacked_bars(title, groups, bars, ["attention", "rest"], values,
                                            "ms/token", spread)))
    return figures


def selection_charts(selection: pd.DataFrame) -> list[Figure]:
    figures = []
    for column, what in (("mass", "attention mass captured"),
                         ("oracle_recall", "oracle block recall")):
        for (device, ctx), cell in selection.groupby(["device", "ctx"], sort=True, dropna=False):
            if cell["k"].dropna().nunique() < 2:
                continue
            series = []
            for policy, group in cell.groupby("policy", sort=True):
                points = sorted((float(k), float(v)) for k, v in zip(group["k"], group[column],
                                                                     strict=True)
                                if _num(k) is not None and _num(v) is not None)
                if points:
                    series.append(Series(str(policy), points))
            title = f"{what} vs k: context {_label(ctx)}, {device}"
            ks = sorted({float(k) for k in cell["k"].dropna()})
            figures.append((title, line_chart(title, series, Axes("k (blocks)", what, log_x=True,
                                                                  y_min=0, y_max=1, x_ticks=ks))))
    return figures


def ttft_charts(ttft: pd.DataFrame) -> list[Figure]:
    """Per device: time to first token against the prompt's length, one line per config."""
    figures = []
    for device, cell in ttft.groupby("device", sort=True):
        lengths = sorted({float(c) for c in cell["ctx"].dropna()})
        if len(lengths) < 2:
            continue  # a line needs two lengths; the table has the rest
        series = []
        for config, group in cell.groupby("config", sort=True):
            rows = [(float(c), float(v), _num(lo), _num(hi), n) for c, v, lo, hi, n in zip(
                *(group[k].tolist() for k in ("ctx", "ttft_ms", "ttft_min_ms", "ttft_max_ms",
                                               "n")), strict=True)
                if _num(c) is not None and _num(v) is not None]
            series.append(Series(str(config), sorted((c, v) for c, v, _, _, _ in rows),
                                 spread=sorted((c, lo, hi) for c, _, lo, hi, n in rows
                                               if n > 1 and lo is not None and hi is not None)))
        title = f"time to first token vs prompt length: {device}"
        if any(s.spread for s in series):
            title += " (whiskers: min-max over runs)"
        figures.append((title, line_chart(title, series, Axes(
            "prompt length (tokens)", "prefill ms", log_x=True, x_ticks=lengths))))
    return figures
