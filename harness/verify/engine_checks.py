"""The audit's checks that run lmc directly on this machine, against an independent reference
(the attention-reference article's maths): no board and no store, a few hundred milliseconds each.

- ``reference_error``: lmc attn-bench's exact attention (``--inputs``, ``--dump-out``; with
  ``ref_attn`` its plain reference instead of the optimised kernel) against the three steps in
  float64 numpy on the same q, k, v (uniform in [-1, 1), seeded): the largest absolute
  difference. ``reference_scale = false`` compares with the formula without 1/sqrt(d) instead;
  ``against = "ref_attn"`` compares the optimised kernel with lmc's plain reference (the
  article's own comparison, both float32).
- ``causal_prefix``: two token sequences that share a prefix, through ``lmc generate
  --dump-logits``: the largest absolute difference of the prefix's logits (causal attention
  never looks past the current position, so they must be equal).
"""

from __future__ import annotations

import math
import platform
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from harness.engines import adapter_of
from harness.engines.lmc import run_here
from reports.audit.checks import ENGINE_METRICS, Check
from reports.audit.claim import Claim
from reports.audit.evidence import Reading
from reports.audit.provenance import Provenance, parameters, this_host


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: bool) -> np.ndarray:
    """The three steps in float64 for one decode query per head: q[H][D], k/v[N][G][D]."""
    heads, dim = q.shape
    group = heads // k.shape[1]
    out = np.empty((heads, dim))
    for h in range(heads):
        keys, values = k[:, h // group].astype(np.float64), v[:, h // group].astype(np.float64)
        scores = keys @ q[h].astype(np.float64) / (math.sqrt(dim) if scale else 1.0)
        weights = np.exp(scores - scores.max())
        out[h] = (weights / weights.sum()) @ values
    return out


class EngineChecks:
    """The checks, with lmc built (or taken from the build cache) for this machine."""

    def __init__(self, model: Path) -> None:
        build = adapter_of("lmc").build(platform.machine(), None)
        self.binary, self.model = Path(build.binary), model
        self.revision = f"lmc {str(build.revision)[:10]} (source {build.source_hash[:10]})"

    def checks(self) -> dict[str, Check]:
        """Metric -> check: each engine metric's check is the method of its name."""
        return {name: getattr(self, name) for name in ENGINE_METRICS}

    def _provenance(self, claim: Claim, model: str, data: str) -> Provenance:
        return Provenance(model=model, device=f"{this_host()}, lmc run directly", data=data,
                          revision=self.revision,
                          article=claim.setting or "not stated in the claims file")

    def reference_error(self, claim: Claim, _runs: pd.DataFrame) -> Reading:
        p = claim.measure.params
        ctx, heads = int(p.get("ctx", 4096)), int(p.get("heads", 16))
        kv_heads, dim = int(p.get("kv_heads", 8)), int(p.get("head_dim", 128))
        rng = np.random.default_rng(int(p.get("seed", 0)))
        q = rng.uniform(-1, 1, (heads, dim)).astype("<f4")
        k, v = (rng.uniform(-1, 1, (ctx, kv_heads, dim)).astype("<f4") for _ in range(2))
        importance = rng.uniform(0, 1, ctx).astype("<f4")
        flags = ["--ref-attn"] if p.get("ref_attn") else []
        inputs = b"".join(a.tobytes() for a in (q, k, v, importance))
        shape = ["--ctx", str(ctx), "--heads", str(heads), "--kv-heads", str(kv_heads),
                 "--head-dim", str(dim)]
        got = self._attention(shape, inputs, flags).reshape(heads, dim).astype(np.float64)
        kernel = "lmc's plain reference (--ref-attn)" if flags else "lmc's optimised kernel"
        if p.get("against") == "ref_attn":
            want = self._attention(shape, inputs, ["--ref-attn"]).reshape(heads, dim)
            other = "lmc's plain reference (--ref-attn), both float32"
        else:
            scale = bool(p.get("reference_scale", True))
            want = reference_attention(q, k, v, scale)
            other = f"float64 numpy {'with' if scale else 'without'} 1/sqrt(d)"
        diff = float(np.abs(got - want).max())
        return Reading(
            value=diff, text=f"max difference {diff:.3g}", noise=0.0,
            detail=f"{kernel} against {other}; outputs up to {float(np.abs(want).max()):.3g}",
            provenance=self._provenance(
                claim, "none: lmc attn-bench on seeded data",
                f"one decode query per head over {ctx} positions, {heads} heads / {kv_heads} KV "
                f"heads / head_dim {dim}, uniform q/k/v in [-1, 1) (numpy seed "
                f"{int(p.get('seed', 0))})"))

    def _attention(self, shape: list[str], inputs: bytes, flags: list[str]) -> np.ndarray:
        """lmc attn-bench's exact attention output (f32 [H][D]) on these inputs."""
        with tempfile.TemporaryDirectory() as tmp:
            given, out = Path(tmp) / "inputs.f32", Path(tmp) / "out.f32"
            given.write_bytes(inputs)
            run_here(self.binary, "attn-bench", None, None,
                     [*shape, "--attn", "exact", "--inputs", str(given), "--dump-out", str(out),
                      "--runs", "1", "--warmup", "0", *flags])
            return np.frombuffer(out.read_bytes(), dtype="<f4").astype(np.float64)

    def causal_prefix(self, claim: Claim, _runs: pd.DataFrame) -> Reading:
        p = claim.measure.params
        prefix, length = int(p.get("prefix", 256)), int(p.get("length", 512))
        rng = np.random.default_rng(int(p.get("seed", 0)))
        vocab = int(p.get("vocab", 1000))
        first = rng.integers(3, vocab, length)
        second = np.concatenate([first[:prefix], rng.integers(3, vocab, length - prefix)])
        logits, config = [], {}
        with tempfile.TemporaryDirectory() as tmp:
            for i, ids in enumerate((first, second)):
                dump = Path(tmp) / f"logits{i}.f32"
                doc = run_here(self.binary, "generate", self.model, [int(t) for t in ids],
                               ["--max-new", "0", "--dump-logits", str(dump)])
                config = doc["config"]["model_config"]
                vocab_size = int(config["vocab_size"])
                logits.append(np.frombuffer(dump.read_bytes(), dtype="<f4")
                              .reshape(length, vocab_size))
        diff = float(np.abs(logits[0][:prefix] - logits[1][:prefix]).max())
        after = float(np.abs(logits[0][prefix:] - logits[1][prefix:]).max())
        return Reading(
            value=diff, text=f"max prefix logit difference {diff:.3g}", noise=0.0,
            detail=f"the {length - prefix} positions after the prefix differ by up to "
                   f"{after:.3g} (the sequences differ there)",
            provenance=self._provenance(
                claim, f"{self.model.name} ({parameters(config) / 1e6:.2f} M parameters, "
                       f"{config['num_hidden_layers']} layers; lmc generate, exact attention)",
                f"two sequences of {length} random token ids sharing the first {prefix}"))
