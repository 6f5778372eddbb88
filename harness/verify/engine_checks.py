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
- ``selection_rule``: lmc attn-bench's sparse selection (``--trace-selection``) on inputs made
  for one step of the block-selection article's rule to decide (harness.verify.selection_rule),
  against that rule written from the article: the fraction of heads that select exactly the
  rule's blocks.
- ``renormalised_error``: lmc attn-bench's sparse output against the three steps in float64 over
  the positions of the blocks it selected (its trace) only: softmax renormalised over them.
- ``prefill_importance``: lmc generate's prefill importance (``--dump-importance``) of an exact
  and a sparse prefill of one prompt against layer 0's importance recomputed from the dumped
  queries and keys (harness.verify.importance_check): the relative error against its own mode.

Each check runs on every seed of ``measure.params.seeds`` (default: ``seed``, else 0): the
seeds are its independent units, and the figure is the worst of them. ``EngineChecks`` takes
another binary for the mutant tests.

Mutants (``MUTANTS``, ``build_mutant``): lmc with one rule of an article broken, to prove that
the audit's check of that rule can fail (tests/audit/test_mutants.py judges each claim that
names a mutant against it and asserts that its verdict flips). A mutant is built from a patched
scratch copy of engine/: the release sources are never touched, so no release build carries a
mutant and the release bits do not change. Each edit names the release text it replaces, which
must occur exactly once, so that an engine change that moves the rule fails loudly here instead
of building an unbroken "mutant". Builds are cached by their sources' hash like any lmc build:
one build per mutant, reused by later test sessions.
"""

from __future__ import annotations

import math
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness import ENGINE_DIR
from harness.engines import adapter_of
from harness.engines.base import host_arch
from harness.engines.lmc import run_here
from harness.engines.lmc.build import build_engine, default_build_root
from harness.errors import InputError
from harness.verify.importance_check import prefill_importance
from harness.verify.selection_rule import article_selection, scenario, traced_selections
from reports.audit.checks import ENGINE_METRICS, Check
from reports.audit.claim import Claim
from reports.audit.evidence import Reading, Units
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

    def __init__(self, model: Path, binary: Path | None = None, revision: str = "") -> None:
        self.model = model
        if binary is not None:
            self.binary, self.revision = binary, revision or f"lmc binary {binary}"
            return
        build = adapter_of("lmc").build(platform.machine(), None)
        self.binary = Path(build.binary)
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
        seeds = _seeds(p)
        flags = ["--ref-attn"] if p.get("ref_attn") else []
        shape = ["--ctx", str(ctx), "--heads", str(heads), "--kv-heads", str(kv_heads),
                 "--head-dim", str(dim)]
        kernel = "lmc's plain reference (--ref-attn)" if flags else "lmc's optimised kernel"
        scale = bool(p.get("reference_scale", True))
        other = (f"float64 numpy {'with' if scale else 'without'} 1/sqrt(d)"
                 if p.get("against") != "ref_attn"
                 else "lmc's plain reference (--ref-attn), both float32")
        diffs, largest = [], 0.0
        for seed in seeds:
            rng = np.random.default_rng(seed)
            q = rng.uniform(-1, 1, (heads, dim)).astype("<f4")
            k, v = (rng.uniform(-1, 1, (ctx, kv_heads, dim)).astype("<f4") for _ in range(2))
            importance = rng.uniform(0, 1, ctx).astype("<f4")
            inputs = b"".join(a.tobytes() for a in (q, k, v, importance))
            got = self._attention(shape, inputs, flags).reshape(heads, dim)
            if p.get("against") == "ref_attn":
                want = self._attention(shape, inputs, ["--ref-attn"]).reshape(heads, dim)
            else:
                want = reference_attention(q, k, v, scale)
            diffs.append(float(np.abs(got - want).max()))
            largest = max(largest, float(np.abs(want).max()))
        worst = max(diffs)
        return Reading(
            value=worst, text=f"max difference {worst:.3g}", noise=0.0,
            detail=f"{kernel} against {other}, worst of {len(seeds)} seeds: "
                   + ", ".join(f"{d:.3g}" for d in diffs)
                   + f"; outputs up to {largest:.3g}",
            units=seed_units(seeds, "seeded inputs"),
            provenance=self._provenance(
                claim, "none: lmc attn-bench on seeded data",
                f"one decode query per head over {ctx} positions, {heads} heads / {kv_heads} KV "
                f"heads / head_dim {dim}, uniform q/k/v in [-1, 1) (numpy seeds "
                f"{', '.join(map(str, seeds))})"))

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
        prefix, length = int(p.get("prefix", 250)), int(p.get("length", 512))
        vocab, seeds = int(p.get("vocab", 1000)), _seeds(p)
        diffs, after, config = [], 0.0, {}
        with tempfile.TemporaryDirectory() as tmp:
            for seed in seeds:
                rng = np.random.default_rng(seed)
                first = rng.integers(3, vocab, length)
                second = np.concatenate([first[:prefix],
                                         rng.integers(3, vocab, length - prefix)])
                logits = []
                for i, ids in enumerate((first, second)):
                    dump = Path(tmp) / f"logits{i}.f32"
                    doc = run_here(self.binary, "generate", self.model, [int(t) for t in ids],
                                   ["--max-new", "0", "--dump-logits", str(dump)])
                    config = doc["config"]["model_config"]
                    logits.append(np.frombuffer(dump.read_bytes(), dtype="<f4")
                                  .reshape(length, int(config["vocab_size"])))
                diffs.append(float(np.abs(logits[0][:prefix] - logits[1][:prefix]).max()))
                after = max(after, float(np.abs(logits[0][prefix:] - logits[1][prefix:]).max()))
        worst = max(diffs)
        return Reading(
            value=worst, text=f"max prefix logit difference {worst:.3g}", noise=0.0,
            detail=f"worst of {len(seeds)} pairs of sequences; the {length - prefix} positions "
                   f"after the prefix differ by up to {after:.3g} (the sequences differ there)",
            units=seed_units(seeds, "pairs of random sequences"),
            provenance=self._provenance(
                claim, f"{self.model.name} ({parameters(config) / 1e6:.2f} M parameters, "
                       f"{config['num_hidden_layers']} layers; lmc generate, exact attention)",
                f"two sequences of {length} random token ids sharing the first {prefix} (off "
                "the prefill's tile and block boundaries)"))

    def selection_rule(self, claim: Claim, _runs: pd.DataFrame) -> Reading:
        p = claim.measure.params
        name, seeds = str(p.get("scenario", "ties")), _seeds(p)
        matched = heads = 0
        misses = []
        with tempfile.TemporaryDirectory() as tmp:
            for seed in seeds:
                inputs = scenario(name, seed)
                given, trace = Path(tmp) / "inputs.f32", Path(tmp) / "trace.txt"
                given.write_bytes(inputs.bytes())
                (n_heads, dim), ctx = inputs.q.shape, len(inputs.k)
                kv_heads = inputs.k.shape[1]
                run_here(self.binary, "attn-bench", None, None,
                         ["--ctx", str(ctx), "--heads", str(n_heads), "--kv-heads",
                          str(kv_heads), "--head-dim", str(dim), "--attn", "sparse", "--k",
                          str(inputs.budget), "--inputs", str(given), "--trace-selection",
                          str(trace), "--runs", "1", "--warmup", "0"])
                chosen = traced_selections(trace.read_text())
                group = n_heads // kv_heads
                for head in range(n_heads):
                    want = article_selection(inputs.q[head], inputs.k[:, head // group],
                                             inputs.importance, inputs.budget)
                    heads += 1
                    if chosen.get(head) == want:
                        matched += 1
                    else:
                        misses.append(f"seed {seed} head {head}: lmc {chosen.get(head)}, "
                                      f"the rule {want}")
        value = matched / heads
        return Reading(
            value=value, text=f"{value:.3g} ({matched}/{heads} heads select the rule's blocks)",
            noise=0.0, detail="; ".join(misses[:3]) or "every head selects the rule's blocks",
            units=seed_units(seeds, f"seeded inputs of scenario {name}"),
            provenance=self._provenance(
                claim, "none: lmc attn-bench sparse --trace-selection on crafted data",
                f"scenario {name} (harness/verify/selection_rule.py): k = "
                f"{scenario(name, seeds[0]).budget}, 32-position blocks, 8 probes"))


    def renormalised_error(self, claim: Claim, _runs: pd.DataFrame) -> Reading:
        p = claim.measure.params
        ctx, heads, dim = int(p.get("ctx", 330)), int(p.get("heads", 2)), int(p.get("head_dim", 16))
        budget, seeds = int(p.get("k", 4)), _seeds(p)
        within, whole = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for seed in seeds:
                rng = np.random.default_rng(seed)
                q = rng.uniform(-1, 1, (heads, dim)).astype("<f4")
                k, v = (rng.uniform(-1, 1, (ctx, 1, dim)).astype("<f4") for _ in range(2))
                importance = rng.uniform(0, 1, ctx).astype("<f4")
                given, trace, out = (Path(tmp) / n for n in ("in.f32", "trace.txt", "out.f32"))
                given.write_bytes(b"".join(a.tobytes() for a in (q, k, v, importance)))
                run_here(self.binary, "attn-bench", None, None,
                         ["--ctx", str(ctx), "--heads", str(heads), "--kv-heads", "1",
                          "--head-dim", str(dim), "--attn", "sparse", "--k", str(budget),
                          "--inputs", str(given), "--trace-selection", str(trace),
                          "--dump-out", str(out), "--runs", "1", "--warmup", "0"])
                got = np.frombuffer(out.read_bytes(), dtype="<f4").reshape(heads, dim)
                chosen = traced_selections(trace.read_text())
                for head in range(heads):
                    rows = np.concatenate([np.arange(b * 32, min(b * 32 + 32, ctx))
                                           for b in chosen[head]])
                    picked = reference_attention(q[head:head + 1], k[rows], v[rows], True)[0]
                    every = reference_attention(q[head:head + 1], k, v, True)[0]
                    within.append(float(np.abs(got[head] - picked).max()))
                    whole.append(float(np.abs(got[head] - every).max()))
        worst = max(within)
        return Reading(
            value=worst, text=f"max difference {worst:.3g}", noise=0.0,
            detail=f"lmc's sparse output against softmax over the selected blocks' positions "
                   f"only (float64); against softmax over every position it differs by up to "
                   f"{max(whole):.3g}",
            units=seed_units(seeds, "seeded inputs"),
            provenance=self._provenance(
                claim, "none: lmc attn-bench sparse on seeded data",
                f"one decode query per head over {ctx} positions, {heads} heads / 1 KV head / "
                f"head_dim {dim}, k = {budget} blocks of 32 (the blocks from its "
                "--trace-selection)"))

    def prefill_importance(self, claim: Claim, _runs: pd.DataFrame) -> Reading:
        seeds = _seeds(claim.measure.params)
        return prefill_importance(
            claim, self.binary, self.model, seeds,
            lambda model, data: self._provenance(claim, model, data),
            seed_units(seeds, "prompts of random token ids"))


def seed_units(seeds: list[int], what: str) -> Units:
    """A check's independent units: one input (or pair) per seed."""
    return Units(len(seeds), f"{len(seeds)} {what} (numpy seeds {', '.join(map(str, seeds))})")


def _seeds(params: dict) -> list[int]:
    """The check's seeds: ``seeds``, else ``seed``, else 0."""
    if "seeds" in params:
        return [int(s) for s in params["seeds"]]
    return [int(params.get("seed", 0))]


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule it breaks, in words
    # the engine sources it patches, each with its edits: (release text, mutant text)
    edits: dict[str, tuple[tuple[str, str], ...]]


MUTANTS = {m.name: m for m in (
    Mutant("budget", "the importance reservation takes k / 2 blocks instead of (k + 1) / 2",
           {"select.c": (("picks, 0, (cfg->k + 1) / 2);", "picks, 0, cfg->k / 2);"),)}),
    Mutant("budget-short", "the importance reservation is one block short of the rule: "
           "(k + 1) / 2 - 1 blocks (15 at k = 32)", {"select.c": (
               ("picks, 0, (cfg->k + 1) / 2);", "picks, 0, (cfg->k + 1) / 2 - 1);"),)}),
    Mutant("thread-dependent", "the selection depends on the thread count: with more than one "
           "thread, every head of a GQA group selects from its first head's probe scores",
           {"attend_heads.c": (
               ("head_input(job, h, scores + (size_t)g * a->n_blocks,",
                "head_input(job, h, scores + (size_t)(pool_threads(a->pool) > 1 ? 0 : g) * "
                "a->n_blocks,"),)}),
    Mutant("recency", "no recency insurance: the last block is kept only when chosen",
           {"select.c": (("if (cfg->recency && !s->used[last] && count > n_imp) {",
                          "if (0 && cfg->recency && !s->used[last] && count > n_imp) {"),)}),
    Mutant("importance-evicted", "the recency insurance replaces the first pick (an importance "
           "pick when there is one) instead of the lowest probe pick", {"select.c": (
               ("        s->used[sel[count - 1]] = 0;\n        sel[count - 1] = last;",
                "        s->used[sel[0]] = 0;\n        sel[0] = last;"),)}),
    Mutant("short-count", "with no more blocks than k, the selection stops one block short of "
           "the blocks there are (the last one is left out)", {"select.c": (
               ("        *select_bytes = 0;\n        return n_blocks;",
                "        *select_bytes = 0;\n        return n_blocks - 1;"),)}),
    Mutant("ties", "ties go to the higher block index", {"select.c": (
        ("if (best < 0 || score[b] > score[best]) best = b;",
         "if (best < 0 || score[b] >= score[best]) best = b;"),
        ("if (m == want && !(sc > score[top[m - 1]])) continue;",
         "if (m == want && !(sc >= score[top[m - 1]])) continue;"),
        ("for (; i > 0 && sc > score[top[i - 1]]; i--)",
         "for (; i > 0 && sc >= score[top[i - 1]]; i--)"))}),
    Mutant("renorm-extra", "the sparse softmax's denominator also counts a weight from outside "
           "the selected blocks (one more key at the running max)", {"attn_kernel.c": (
               ("        float inv = 1.0f / l[g];",
                "        float inv = 1.0f / (l[g] + 1.0f);"),)}),
    Mutant("causal", "each prefill query also sees the next position (one row of the future)",
           {"attn_kernel.c": (("int vis = pos0 + t + 1 - p0 < np ? pos0 + t + 1 - p0 : np;",
                               "int vis = pos0 + t + 2 - p0 < np ? pos0 + t + 2 - p0 : np;"),)}),
    Mutant("importance-exact", "a sparse prefill records its importance from exact attention over "
           "every position (its queries, one at a time, still attend only their blocks)",
           {"attend_tile.c": (
               ("return a->opt.prefill_sparse && policy_has",
                "return 0 && a->opt.prefill_sparse && policy_has"),),
            "attend_heads.c": (
               ("if (!decode && !a->opt.prefill_sparse) return 0;", "if (!decode) return 0;"),
               ("int need_exact = measure ||", "int need_exact = measure || !decode ||"),),
            "attend_layer.c": (
               ("            const int *sel = hs->sel + (size_t)h * a->n_blocks;\n"
                "            const float *probs = hs->att_probs + (size_t)h * a->capacity;\n"
                "            for (int i = 0; i < hs->n_sel[h]; i++) {",
                "            const int *sel = a->diag.oracle_sel + (size_t)h * a->n_blocks;\n"
                "            const float *probs = a->diag.exact_probs + (size_t)h * a->capacity;\n"
                "            for (int i = 0; i < (n_pos + bs - 1) / bs; i++) {"),)}),
    Mutant("ref-sum-short", "the plain reference's softmax leaves the last position out of "
           "its sum (an off-by-one in the loop bound)", {"attn_kernel.c": (
               ("float sum = pairwise_sum(s, n_pos);",
                "float sum = pairwise_sum(s, n_pos - 1);"),)}),
    Mutant("scale", "the optimised kernels drop the 1/sqrt(d) scale (the plain reference keeps "
           "it)", {"attn_kernel.c": (
               ("    float scale = 1.0f / sqrtf((float)D);\n    float m[ATTN_MAX_GROUP]",
                "    float scale = 1.0f;\n    float m[ATTN_MAX_GROUP]"),
               ("head g */\n    float scale = 1.0f / sqrtf((float)D);",
                "head g */\n    float scale = 1.0f;"))}),
)}


def mutant_sources(name: str, dest: Path) -> Path:
    """engine/ copied into ``dest`` with mutant ``name``'s edits; returns the copy."""
    if name not in MUTANTS:
        raise InputError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    mutant = MUTANTS[name]
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ENGINE_DIR, dest, ignore=shutil.ignore_patterns("*.md"))
    for file, edits in mutant.edits.items():
        path = dest / file
        text = path.read_text()
        for old, new in edits:
            if text.count(old) != 1:
                raise InputError(f"mutant {name}: engine/{file} holds {old!r} "
                                 f"{text.count(old)} times, not once; the rule moved: update "
                                 "harness/verify/engine_checks.py")
            text = text.replace(old, new)
        path.write_text(text)
    return dest


def build_mutant(name: str, build_root: Path | None = None) -> Path:
    """The lmc binary of mutant ``name`` for this machine (built once, then cached)."""
    root = build_root or default_build_root()
    sources = mutant_sources(name, root / "mutant-sources" / name)
    return Path(build_engine(host_arch(), engine_dir=sources, build_root=root).binary)
