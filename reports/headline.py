"""The paragraph at the top of a report that says what a needle experiment shows about sparse
attention: where k covers every block (nothing to gain), and at the longest context how small k
can be while the needle is still found as often as with exact attention, and what that buys.

Every number comes from the stored runs (medians over ok runs) of one board, named in the
paragraph: a real board before an emulated one, and a board whose runs are complete before one
with runs missing (``board_order``), so the paragraph is as true as the tables below it.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.aggregate import critical_k_table, k_sweep_table
from reports.stats import compare_samples

SPARSE = "sparse"


def _ms(value: float) -> str:
    return f"{value:.3g}"


def _hits(cell: pd.DataFrame) -> str:
    recall = cell["recall"].dropna()
    return f"{int(round(recall.sum()))}/{len(recall)}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ratio(part: pd.Series, whole: pd.Series) -> float | None:
    part, whole = part.dropna(), whole.dropna()
    if part.empty or whole.empty or not whole.median():
        return None
    return float(part.median() / whole.median())


def what_this_shows(runs: pd.DataFrame) -> str:
    """The paragraph for the best board with ok needle runs under both exact and sparse
    attention (see ``board_order``); "" when the experiment has no such pair."""
    ok = runs[(runs["status"] == "ok") & (runs["kind"] == "needle")]
    candidates = []
    for device in ok["device"].unique():
        mine = ok[ok["device"] == device]
        exact, sparse = mine[mine["policy"] == "exact"], mine[mine["policy"] == SPARSE]
        contexts = sorted(set(exact["ctx"]) & set(sparse["ctx"]))
        if contexts:
            candidates.append((board_order(runs, device), device, exact, sparse, contexts))
    if not candidates:
        return ""
    (emulated, missing, _, _), device, exact, sparse, contexts = min(
        candidates, key=lambda c: c[0])
    return _paragraph(exact, sparse, [int(c) for c in contexts],
                      _board_text(device, bool(emulated), missing))


def board_order(runs: pd.DataFrame, device: str) -> tuple[int, int, int, str]:
    """Which board's figures a headline takes: a real board before an emulated one, one whose
    needle runs are complete (all ok) before one with runs missing, then the most ok runs, then
    the name."""
    needle = runs[(runs["device"] == device) & (runs["kind"] == "needle")]
    ok = int((needle["status"] == "ok").sum())
    return int(bool(needle["emulated"].any())), len(needle) - ok, -ok, str(device)


def _board_text(device: str, emulated: bool, missing: int) -> str:
    what = "an emulated board: no real board has both policies" if emulated else "a real board"
    if missing:
        what += f"; {missing} of its needle runs are not ok"
    return f"{device} ({what})"


def _paragraph(exact: pd.DataFrame, sparse: pd.DataFrame, contexts: list[int],
               board: str) -> str:
    block = int(sparse["block"].dropna().median())
    k_max = int(sparse["k"].max())
    covered = [c for c in contexts if k_max >= math.ceil(c / block)]
    longest = contexts[-1]
    text = [f"Sparse top-k attention attends to k blocks of {block} tokens per decode step "
            "instead of the whole context."]
    if covered:
        at = covered[-1]
        whole = sparse[(sparse["ctx"] == at) & (sparse["k"] == k_max)]["attn_ms_per_token"]
        text.append(
            f"At {_and([str(c) for c in covered])} tokens k = {k_max} already covers every "
            f"block, so there sparse k = {k_max} does exact's work plus choosing the blocks "
            f"(attention {_ms(whole.median())} against "
            f"{_ms(exact[exact['ctx'] == at]['attn_ms_per_token'].median())} ms/token at "
            f"{at}).")
    if longest not in covered:
        text.append(_longest(exact[exact["ctx"] == longest], sparse[sparse["ctx"] == longest],
                             longest, block))
    text.append(f"Medians over the ok runs on {board}; the timing table flags runs taken on a "
                "loaded, throttled or emulated machine.")
    return " ".join(text)


def _decided(exact: pd.Series, sparse: pd.Series) -> str:
    """Whether the decode times differ beyond noise: the U test over the runs (every depth
    and repeat of the length), or how many runs a side it would take."""
    a, b = exact.dropna().tolist(), sparse.dropna().tolist()
    change = compare_samples(a, b)
    if change.verdict == "inconclusive":
        return (f", not decided ({min(len(a), len(b))} runs a side; the Mann-Whitney U test "
                f"needs {change.needed}: raise repeats)")
    return (f", {change.verdict} (Mann-Whitney U over {len(a)} and {len(b)} runs, p = "
            f"{change.p_value:.2g})")


def _longest(exact: pd.DataFrame, sparse: pd.DataFrame, ctx: int, block: int) -> str:
    blocks = math.ceil(ctx / block)
    sweep = k_sweep_table(pd.concat([exact, sparse]))
    critical = critical_k_table(sweep)
    row = critical[critical["policy"] == SPARSE]
    k = None if row.empty or pd.isna(row["critical_k"].iloc[0]) else int(row["critical_k"].iloc[0])
    if k is None:
        return (f"At {ctx} tokens ({blocks} blocks) no k measured finds the needle as often as "
                f"exact attention ({_hits(exact)} runs).")
    chosen = sparse[sparse["k"] == k]
    parts = [f"At {ctx} tokens ({blocks} blocks) k = {k} is the smallest k measured that finds "
             f"the needle as often as exact attention ({_hits(chosen)} runs against "
             f"{_hits(exact)}): it attends to {100 * k / blocks:.0f} % of the blocks"]
    bytes_ratio = _ratio(chosen["bytes_read"], exact["bytes_read"])
    if bytes_ratio is not None:
        parts.append(f"reads {100 * bytes_ratio:.0f} % of exact's bytes per step")
    attn = _ratio(chosen["attn_ms_per_token"], exact["attn_ms_per_token"])
    if attn is not None:
        parts.append(f"its attention takes {_ms(chosen['attn_ms_per_token'].median())} against "
                     f"{_ms(exact['attn_ms_per_token'].median())} ms/token ({attn:.2f}x)")
    decode = _ratio(chosen["decode_ms_per_token"], exact["decode_ms_per_token"])
    if decode is not None:
        parts.append(f"and a whole decode step {_ms(chosen['decode_ms_per_token'].median())} "
                     f"against {_ms(exact['decode_ms_per_token'].median())} ms ({decode:.2f}x)"
                     + _decided(exact["decode_ms_per_token"], chosen["decode_ms_per_token"]))
    text = ", ".join(parts) + "."
    smaller = sorted(int(x) for x in set(sparse["k"].dropna()) if x < k)
    if smaller:
        losses = [f"k = {s}: {_hits(sparse[sparse['k'] == s])}" for s in smaller]
        text += f" Smaller k read less but lose the needle ({'; '.join(losses)} runs)."
    return text


def _range(values: pd.Series) -> str:
    low, high = float(values.min()), float(values.max())
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def prefill_headline(ttft: pd.DataFrame) -> str:
    """What sparse prefill does to the time to first token (``aggregate.ttft_table``): per
    board, the prompt lengths where it is faster than exact prefill and those where it is
    slower, said first; "" without sparse-prefill runs."""
    sparse = ttft[ttft["prefill_attn"].notna() & (ttft["prefill_attn"] != "exact")
                  & ttft["vs_exact"].notna()]
    sentences = []
    for device, rows in sparse.groupby("device", sort=True):
        slower, faster, mixed = [], [], []
        for ctx, cell in rows.groupby("ctx", sort=True):
            ratio = pd.to_numeric(cell["vs_exact"])
            where = f"{int(ctx)} tokens ({_range(ratio)})"
            (faster if ratio.min() > 1 else slower if ratio.max() < 1 else mixed).append(where)
        parts = []
        if slower:
            parts.append(f"sparse prefill is SLOWER than exact at {_and(slower)}")
        if faster:
            parts.append(f"faster at {_and(faster)}")
        if mixed:
            parts.append(f"faster in some configs and slower in others at {_and(mixed)}")
        text = "; ".join(parts)
        sentences.append(f"Time to first token on {device}: {text[0].upper()}{text[1:]} "
                         "(exact prefill's median over sparse's, over its sparse configs; "
                         "above 1 is faster).")
    return " ".join(sentences)
