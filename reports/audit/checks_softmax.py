"""Arithmetic claims about attention's softmax (the attention-reference article), computed here with
numpy in float32, the engine's precision: no runs, the claim's ``measure.params`` give the setting.

- ``exp_overflow``: 1.0 when float32 exp(``x``) is infinite, else 0.0;
- ``dot_growth``: the exponent p of std(q·k) ∝ d^p over ``dims`` (q, k i.i.d. N(0, ``sigma``²)),
  the mean over ``repeats`` seeds, with its 95 % interval as the noise;
- ``softmax_overflow``: the fraction of ``queries`` queries whose attention output over ``ctx``
  keys (q, k, v i.i.d. N(0, ``sigma``²), head_dim ``d``) is not finite, with or without the
  1/sqrt(d) ``scale`` and the max-subtraction (``subtract_max``);
- ``dot_magnitude``: a percentile of |q.k| at one head_dim (q, k i.i.d. N(0, sigma^2));
- ``quotient``: a figure the article derives from its own, recomputed from them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from reports.audit.claim import Claim
from reports.audit.evidence import Reading, Units, paired_margin
from reports.audit.provenance import Provenance, this_host


def _evidence(claim: Claim, data: str) -> Provenance:
    return Provenance(model="none: numpy float32 arithmetic (the engine's precision)",
                      device=this_host(),
                      data=data, revision=f"numpy {np.__version__}",
                      article=claim.setting or "not stated in the claims file")


def _param(claim: Claim, name: str, default: Any) -> Any:
    return claim.measure.params.get(name, default)


def exp_overflow(claim: Claim, _runs: Any) -> Reading:
    x = float(_param(claim, "x", 89.0))
    with np.errstate(over="ignore"):
        value = np.exp(np.float32(x))
        below = np.exp(np.float32(x - 1))
    inf = bool(np.isinf(value))
    largest = float(np.finfo(np.float32).max)
    return Reading(value=float(inf), text=f"exp({x:g}) = {value} in float32",
                   detail=f"exp({x - 1:g}) = {below:.4g}; float32's largest is "
                          f"{largest:.4g} = exp({math.log(largest):.2f})",
                   noise=0.0, provenance=_evidence(claim, f"the single value {x:g}"))


def dot_growth(claim: Claim, _runs: Any) -> Reading:
    dims = [int(d) for d in _param(claim, "dims", [32, 64, 128, 256, 512])]
    sigma, keys = float(_param(claim, "sigma", 1.0)), int(_param(claim, "keys", 4096))
    repeats = int(_param(claim, "repeats", 8))
    slopes = []
    for seed in range(repeats):
        rng = np.random.default_rng(seed)
        stds = []
        for d in dims:
            q = rng.normal(0, sigma, d).astype(np.float32)
            k = rng.normal(0, sigma, (keys, d)).astype(np.float32)
            stds.append(float(np.std(k @ q)))
        slopes.append(float(np.polyfit(np.log(dims), np.log(stds), 1)[0]))
    value = sum(slopes) / len(slopes)
    return Reading(value=value, text=f"std(q.k) ~ d^{value:.3f}",
                   detail=f"d = {', '.join(map(str, dims))}; {keys} keys, {repeats} seeds",
                   noise=paired_margin(slopes),
                   units=Units(repeats, f"{repeats} seeds (0-{repeats - 1})"),
                   provenance=_evidence(claim, f"q, k i.i.d. N(0, {sigma:g}^2), {keys} keys, "
                                               f"{repeats} independent seeds"))


def dot_magnitude(claim: Claim, _runs: Any) -> Reading:
    """The ``percentile`` of |q.k| at head_dim ``d`` (q, k i.i.d. N(0, sigma^2), float32), per
    seed; the mean over the seeds, their 95 % interval as the noise."""
    d, sigma = int(_param(claim, "d", 128)), float(_param(claim, "sigma", 1.0))
    keys, share = int(_param(claim, "keys", 4096)), float(_param(claim, "percentile", 95))
    seeds = [int(s) for s in _param(claim, "seeds", [0, 1, 2, 3, 4])]
    figures = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        q = rng.normal(0, sigma, d).astype(np.float32)
        k = rng.normal(0, sigma, (keys, d)).astype(np.float32)
        figures.append(float(np.percentile(np.abs(k @ q), share)))
    value = sum(figures) / len(figures)
    return Reading(value=value, text=f"|q.k| {share:g}th percentile {value:.1f}",
                   detail=f"d = {d}, {keys} keys per seed: " + ", ".join(f"{f:.1f}"
                                                                         for f in figures),
                   noise=paired_margin(figures), units=Units(len(seeds), f"{len(seeds)} seeds"),
                   provenance=_evidence(claim, f"q, k i.i.d. N(0, {sigma:g}^2), {keys} keys, "
                                               f"seeds {', '.join(map(str, seeds))}"))


def attention_fp32(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: bool,
                   subtract_max: bool) -> np.ndarray:
    """The three steps in float32 for each query row of q: scores, softmax, weighted V."""
    scores = q @ k.T
    if scale:
        scores = scores / np.float32(math.sqrt(q.shape[1]))
    if subtract_max:
        scores = scores - scores.max(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(scores)
        weights = weights / weights.sum(axis=1, keepdims=True)
        return weights @ v


def softmax_overflow(claim: Claim, _runs: Any) -> Reading:
    ctx, d = int(_param(claim, "ctx", 4096)), int(_param(claim, "d", 128))
    sigma, queries = float(_param(claim, "sigma", 1.0)), int(_param(claim, "queries", 16))
    scale, subtract = bool(_param(claim, "scale", True)), bool(_param(claim, "subtract_max", True))
    seed = int(_param(claim, "seed", 0))
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(0, sigma, shape).astype(np.float32)
               for shape in ((queries, d), (ctx, d), (ctx, d)))
    out = attention_fp32(q, k, v, scale, subtract)
    bad = int((~np.isfinite(out).all(axis=1)).sum())
    top = float((q @ k.T).max() / (math.sqrt(d) if scale else 1.0))
    how = (f"{'with' if scale else 'without'} the 1/sqrt(d) scale, "
           f"{'with' if subtract else 'without'} max-subtraction")
    return Reading(value=bad / queries, text=f"{bad}/{queries} queries not finite",
                   detail=f"{how}; largest score {top:.1f} (float32 exp overflows above 88.72)",
                   noise=0.0, units=Units(1, f"1 seed ({seed}): {queries} queries of one draw"),
                   provenance=_evidence(claim, f"{queries} queries over {ctx} keys, q/k/v "
                                               f"i.i.d. N(0, {sigma:g}^2), head_dim {d}"))


def quotient(claim: Claim, _runs: Any) -> Reading:
    """The article's own figures combined: sum(``numerator``) / sum(``denominator``) (each a
    number or a list), to check a figure the article derives from others."""
    def total(name: str) -> float:
        value = _param(claim, name, 1.0)
        return float(sum(value)) if isinstance(value, list) else float(value)
    top, bottom = total("numerator"), total("denominator")
    value = top / bottom
    return Reading(value=value, text=f"{top:g} / {bottom:g} = {value:.4g}", noise=0.0,
                   provenance=Provenance(
                       model="none: the article's own figures", device="none (arithmetic)",
                       data=f"{_param(claim, 'numerator', 1)} / "
                            f"{_param(claim, 'denominator', 1)}",
                       revision="none", article=claim.setting or "not stated"))
