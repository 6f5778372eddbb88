"""``prefill_importance``: the engine check of the block-selection article's "the prefill
importance is exact when the prefill is exact and sparse when it is sparse: what is recorded
matches what ran".

Each seed draws a prompt of ``length`` random token ids (numpy, seeded) and runs ``lmc generate
--attn sparse --k K --max-new 0 --dump-importance`` on it twice, with ``--prefill-attn exact``
and ``sparse`` (``flags``: more lmc flags, e.g. ``--probe-summary``, under which a sparse
prefill goes query by query instead of a tile at a time). reports.audit.checks_importance
recomputes layer 0's importance from each dump's queries and keys (exact causal softmax, and
softmax over the sparse dump's blocks) and sets each readout against both. The figure is the
largest relative error of a readout against the recompute of its own prefill mode, over the
seeds and both modes; the detail gives the errors against the other mode's. When the two
modes' recomputes are closer than ``min_separation`` on a prompt (a budget that covers the
prompt, say), a readout of the wrong mode would pass too: the reading is then "not
comparable" instead of a verdict.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.engines.lmc import run_here
from reports.audit.checks_importance import ImportanceFigures, importance_figures
from reports.audit.claim import Claim
from reports.audit.evidence import Reading, Units
from reports.audit.importance_dump import ImportanceDump, parse_importance_dump
from reports.audit.provenance import Provenance, parameters


def prefill_figures(binary: Path, model: Path, ids: list[int], k: int, flags: list[str]
                    ) -> tuple[ImportanceFigures, dict]:
    """One prompt's figures from ``binary``'s exact and sparse prefills (with lmc ``flags``
    besides), and the model's config as lmc reported it."""
    dumps: dict[str, ImportanceDump] = {}
    config: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("exact", "sparse"):
            path = Path(tmp) / f"{mode}.txt"
            doc = run_here(binary, "generate", model, ids,
                           ["--attn", "sparse", "--k", str(k), "--prefill-attn", mode,
                            "--max-new", "0", "--dump-importance", str(path), *flags])
            config = doc["config"]["model_config"]
            dumps[mode] = parse_importance_dump(path.read_text(), f"{path.name} (lmc)")
    return importance_figures(dumps["exact"], dumps["sparse"]), config


def prefill_importance(claim: Claim, binary: Path, model: Path, seeds: list[int],
                       provenance: Callable[[str, str], Provenance], units: Units) -> Reading:
    p = claim.measure.params
    length, vocab, k = int(p.get("length", 300)), int(p.get("vocab", 1000)), int(p.get("k", 4))
    least = float(p.get("min_separation", 1e-2))
    flags = [str(f) for f in p.get("flags", [])]  # e.g. --probe-summary: query by query
    figures, config = [], {}
    for seed in seeds:
        ids = [int(t) for t in np.random.default_rng(seed).integers(3, vocab, length)]
        got, config = prefill_figures(binary, model, ids, k, flags)
        figures.append(got)
    own = {m: max(f.own[m] for f in figures) for m in ("exact", "sparse")}
    other = {m: min(f.other[m] for f in figures) for m in ("exact", "sparse")}
    separation = min(f.separation for f in figures)
    worst = max(own.values())
    detail = (f"layer 0, {length} positions, k = {k}; against its own mode's recompute: exact "
              f"{own['exact']:.3g}, sparse {own['sparse']:.3g} (worst of {len(seeds)} prompts); "
              f"against the other mode's: exact {other['exact']:.3g}, sparse "
              f"{other['sparse']:.3g} (least); the two recomputes differ by at least "
              f"{separation:.3g}")
    reading = Reading(
        value=worst, text=f"relative error {worst:.3g} against its own mode", noise=0.0,
        detail=detail, units=units,
        provenance=provenance(
            f"{model.name} ({parameters(config) / 1e6:.2f} M parameters, "
            f"{config.get('num_hidden_layers')} layers; lmc generate --attn sparse --k {k}"
            f"{''.join(' ' + f for f in flags)}, --prefill-attn exact and sparse, "
            "--dump-importance)",
            f"{len(seeds)} prompts of {length} random token ids (numpy seeds "
            f"{', '.join(map(str, seeds))})"))
    if separation < least:
        reading.value, reading.reason = None, (
            f"the exact and sparse prefills' importance differ by only {separation:.3g} "
            f"(< {least:g}): a readout of either mode would match; {detail}")
    return reading
