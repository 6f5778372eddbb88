"""Identity claims: two configs generate byte-identical tokens, or select byte-identical blocks
(their selection traces), on the same prompts."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import Reading, describe, ok_runs, run_ids, select
from reports.runs import first_divergence
from reports.runs import generated_tokens as tokens

PROMPT_KEYS = ["device", "kind", "ctx", "depth", "seed", "length", "repeat"]
BLOCK = 32  # lmc's default block, the article's


def identical_tokens(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The fraction of prompts (same device and input) where a and b agree exactly on every
    repeat: the repeats of a deterministic run are one unit, not several."""
    a = ok_runs(select(runs, claim.measure.a))
    b = ok_runs(select(runs, claim.measure.b))
    if a.empty or b.empty:
        return Reading(reason=f"no successful runs for {describe(claim.measure.a)} and "
                              f"{describe(claim.measure.b)} to compare")
    pairs = a.merge(b, on=PROMPT_KEYS, suffixes=("_a", "_b"))
    if pairs.empty:
        return Reading(reason="the two configs were never run on the same prompts")
    agree: dict[tuple, bool] = {}
    divergent = []
    for row in pairs.itertuples():
        ta, tb = tokens(row.generated_ids_a), tokens(row.generated_ids_b)
        step = first_divergence(ta or [], tb or [])
        prompt = tuple(getattr(row, key) for key in PROMPT_KEYS if key != "repeat")
        same = step is None and ta is not None
        agree[prompt] = agree.get(prompt, True) and same
        if not same:
            divergent.append(f"runs {row.run_id_a}/{row.run_id_b} diverge at step {step}")
    same = sum(agree.values())
    value = same / len(agree)
    detail = (f"{same} of {len(agree)} prompts identical on every repeat ({len(pairs)} pairs "
              "of runs)")
    if divergent:
        detail += "; " + "; ".join(divergent[:3]) + ("; ..." if len(divergent) > 3 else "")
    return Reading(value=value, text=f"{value:.3g} ({same}/{len(agree)} prompts identical)",
                   evidence=run_ids(pairs.rename(columns={"run_id_a": "run_id"}),
                                    pairs.rename(columns={"run_id_b": "run_id"})),
                   detail=detail, noise=0.0)  # an exact count


def _trace(extra: object) -> str | None:
    """The selection trace kept with a run (its outcome's extra, lmc --trace-selection)."""
    try:
        return json.loads(str(extra)).get("selection_trace")
    except (ValueError, AttributeError):
        return None


def identical_traces(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The fraction of prompts where a's and b's selection traces (lmc --trace-selection: the
    blocks each decode step, layer and head selected) are byte-identical."""
    a = ok_runs(select(runs, claim.measure.a))
    b = ok_runs(select(runs, claim.measure.b))
    pairs = a.merge(b, on=PROMPT_KEYS, suffixes=("_a", "_b"))
    if pairs.empty:
        return Reading(reason=f"no prompts with successful runs of both "
                              f"{describe(claim.measure.a)} and {describe(claim.measure.b)}")
    traces = [(_trace(ra), _trace(rb)) for ra, rb in zip(pairs["extra_a"], pairs["extra_b"],
                                                          strict=True)]
    if any(ta is None or tb is None for ta, tb in traces):
        return Reading(reason="a run has no selection trace (the experiment needs "
                              "engine.trace_selection = true)")
    same = sum(ta == tb for ta, tb in traces)
    lines = sum(ta.count("\n") - 1 for ta, _ in traces)
    value = same / len(pairs)
    return Reading(value=value, text=f"{value:.3g} ({same}/{len(pairs)} traces identical)",
                   evidence=run_ids(pairs.rename(columns={"run_id_a": "run_id"}),
                                    pairs.rename(columns={"run_id_b": "run_id"})),
                   detail=f"{same} of {len(pairs)} prompts select the same blocks "
                          f"({lines} step x layer x head selections compared)", noise=0.0)


def shared_blocks(trace: str) -> tuple[int, int]:
    """(fewest blocks that every decode step and head of a layer selected, over the layers, not
    counting a tail block: the block of a traced step's own position, which the recency
    insurance keeps in every selection whatever else is reserved; the most blocks one selection
    held) of a selection trace."""
    common: dict[str, set[str]] = {}
    tails: set[str] = set()
    widest = 0
    for line in trace.splitlines()[1:]:
        pos, layer, _, count, *blocks = line.split()
        tails.add(str(int(pos) // BLOCK))
        widest = max(widest, int(count))
        common[layer] = common[layer] & set(blocks) if layer in common else set(blocks)
    return min((len(c - tails) for c in common.values()), default=0), widest


def trace_shared_blocks(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The blocks a layer selects for every head and decode step alike besides the tail block
    (the fewest over layers and runs), from a's selection traces: what neither a query's own
    scores nor the recency insurance chose (e.g. sparse's importance reservation, made once per
    layer from prefill)."""
    a = ok_runs(select(runs, claim.measure.a))
    traces = [_trace(extra) for extra in a["extra"]]
    if a.empty or any(t is None for t in traces):
        return Reading(reason=f"no successful runs with a selection trace for "
                              f"{describe(claim.measure.a)} (engine.trace_selection = true)")
    shared = [shared_blocks(t) for t in traces if t is not None]
    value = min(s for s, _ in shared)
    return Reading(value=float(value), text=f"{value} blocks besides the tail block",
                   evidence=run_ids(a), noise=0.0,
                   detail=f"{len(shared)} traces; every selection at most "
                          f"{max(w for _, w in shared)} blocks")


def trace_tail_share(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The share of a's traced selections (every decode step, layer and head) that hold the
    block of the current position (the tail block), and which blocks the others chose."""
    a = ok_runs(select(runs, claim.measure.a))
    traces = [_trace(extra) for extra in a["extra"]]
    if a.empty or any(t is None for t in traces):
        return Reading(reason=f"no successful runs with a selection trace for "
                              f"{describe(claim.measure.a)} (engine.trace_selection = true)")
    tail = total = 0
    others: Counter[str] = Counter()
    for trace in traces:
        for line in (trace or "").splitlines()[1:]:
            pos, _layer, _head, _count, *blocks = line.split()
            total += 1
            if str(int(pos) // BLOCK) in blocks:
                tail += 1
            else:
                others.update(blocks)
    if not total:
        return Reading(reason="the traces hold no selections")
    value = tail / total
    chosen = ", ".join(f"block {b} ({n}x)" for b, n in others.most_common(3))
    return Reading(value=value, text=f"{value:.3g} ({tail}/{total} selections)",
                   evidence=run_ids(a), noise=0.0,
                   detail=f"{len(traces)} traces" + (f"; the others chose {chosen}"
                                                     if chosen else ""))


def repeats(ids: list[int], copies: int = 3, longest: int = 4) -> bool:
    """Whether a span of at most ``longest`` tokens follows itself ``copies`` times in ids."""
    for period in range(1, longest + 1):
        for start in range(len(ids) - copies * period + 1):
            span = ids[start:start + period]
            if all(ids[start + i * period:start + (i + 1) * period] == span
                   for i in range(1, copies)):
                return True
    return False


def kept_share(ids: list[int], reference: list[int]) -> float:
    """The share of ``reference``'s tokens (as a multiset) that ``ids`` also holds."""
    if not reference:
        return 1.0
    return sum((Counter(ids) & Counter(reference)).values()) / len(reference)


def collapsed(ids: list[int], reference: list[int] | None) -> bool:
    """Whether an output collapsed: it repeats a span of 1-4 tokens three times in a row, or it
    keeps less than half of what the baseline generates on the same prompt (a fragment such
    as `The606.` where the baseline answers `The ... 606.`)."""
    return repeats(ids) or (reference is not None and kept_share(ids, reference) < 0.5)


def repetition(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The fraction of prompts on which a's output collapses (``collapsed``: a repeated span,
    or less than half of the baseline's output kept); the baseline's own fraction beside it.
    A prompt's repeats are one unit."""
    a = ok_runs(select(runs, claim.measure.a))
    a = a[a["generated_ids"].notna()]
    if a.empty:
        return Reading(reason=f"no successful generate runs for {describe(claim.measure.a)}")
    used, reference = [a], {}
    base_text = ""
    if claim.measure.baseline is not None:
        base = ok_runs(select(runs, claim.measure.baseline))
        base = base[base["generated_ids"].notna()]
        used.append(base)
        reference = {(d, w): tokens(ids) or [] for d, w, ids in
                     zip(base["device"], base["workload_id"], base["generated_ids"],
                         strict=True)}
        base_hits = {(d, w) for (d, w), ids in reference.items() if repeats(ids)}
        base_text = (f"; baseline {describe(claim.measure.baseline)}: {len(base_hits)} of "
                     f"{len(reference)} prompts repeat")
    by_prompt: dict[tuple, bool] = {}
    for device, workload, ids in zip(a["device"], a["workload_id"], a["generated_ids"],
                                     strict=True):
        key = (device, workload)
        hit = collapsed(tokens(ids) or [], reference.get(key))
        by_prompt[key] = by_prompt.get(key, True) and hit
    hits = sum(by_prompt.values())
    value = hits / len(by_prompt)
    return Reading(value=value, text=f"{value:.3g} ({hits}/{len(by_prompt)} prompts collapse)",
                   evidence=run_ids(*used),
                   detail=f"{describe(claim.measure.a)}: {hits} of {len(by_prompt)} prompts "
                          f"collapse on every run ({len(a)} runs){base_text}", noise=0.0)
