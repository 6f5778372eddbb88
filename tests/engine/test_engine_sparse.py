"""Block-sparse attention and the policy zoo: every selection rule, and attention over the
blocks it selects.

A Python reference of every selection rule (below) is checked against the engine's
--trace-selection on random inputs given to `lmc attn-bench --inputs`; crafted inputs check the
seed's mechanisms (needle, k = 1 failure, tie-breaking, the (k+1)/2 budget, recency).
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_engine import lmc_json, write_tokens

POLICIES = ("exact", "sparse", "window", "h2o", "quest", "random", "oracle")
MASK64 = (1 << 64) - 1

# ---------------------------------------------------------------------------------------------
# The Python reference of the selection rules (engine/README.md, "Attention policies")
# ---------------------------------------------------------------------------------------------


def mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def random_key(seed: int, pos: int, layer: int, head: int) -> int:
    x = mix64(seed)
    for v in (pos, layer, head):
        x = mix64(x ^ v)
    return x


def take_top(score, used, want: int, sel: list[int]) -> None:
    """Greedy: highest score first, ties to the lower block index."""
    for _ in range(want):
        best = -1
        for b in range(len(score)):
            if not used[b] and (best < 0 or score[b] > score[best]):
                best = b
        if best < 0:
            return
        used[best] = True
        sel.append(best)


def blocks_of(n_pos: int, bs: int) -> list[range]:
    return [range(b, min(b + bs, n_pos)) for b in range(0, n_pos, bs)]


def reference_select(policy: str, q, keys, importance, *, k: int, bs: int, probes: int = 8,
                     use_importance: bool = True, recency: bool = True, summary: bool = False,
                     seed: int = 0, layer: int = 0, head: int = 0) -> list[int]:
    """Blocks one query head attends to. q: [D]; keys: [n_pos, D] of its KV head (as stored);
    importance: [n_pos] (prefill importance for sparse, accumulated mass for h2o)."""
    q = q.astype(np.float64)
    keys = keys.astype(np.float64)
    n_pos = len(keys)
    blocks = blocks_of(n_pos, bs)
    nb = len(blocks)
    if policy == "exact" or k >= nb:
        return list(range(nb))
    used = [False] * nb
    sel: list[int] = []
    last = nb - 1

    def top_k_with_recency(score):
        if recency:
            used[last] = True
            sel.append(last)
        take_top(score, used, k - len(sel), sel)

    if policy == "sparse":
        probe = []
        for r in blocks:
            if summary and len(r) == bs:
                probe.append(float(q @ keys[r.start:r.stop].mean(axis=0)))
            else:
                step = max(1, len(r) // probes)
                probe.append(max(float(q @ keys[p]) for p in range(r.start, r.stop, step)))
        n_imp = 0
        if use_importance:
            imp = [float(importance[r.start:r.stop].astype(np.float64).sum()) for r in blocks]
            take_top(imp, used, (k + 1) // 2, sel)
            n_imp = len(sel)
        take_top(probe, used, k - len(sel), sel)
        if recency and not used[last] and len(sel) > n_imp:
            sel[-1] = last
    elif policy == "window":
        sel = [0, *range(nb - (k - 1), nb)]
    elif policy == "h2o":
        top_k_with_recency([float(importance[r.start:r.stop].sum()) for r in blocks])
    elif policy == "quest":
        scores = []
        for r in blocks:
            lo, hi = keys[r.start:r.stop].min(axis=0), keys[r.start:r.stop].max(axis=0)
            scores.append(float(np.maximum(q * lo, q * hi).sum()))
        top_k_with_recency(scores)
    elif policy == "random":
        cand = list(range(nb - 1 if recency else nb))
        if recency:
            sel.append(last)
        state = random_key(seed, n_pos - 1, layer, head)
        for i in range(min(k - len(sel), len(cand))):
            state = mix64(state)
            j = i + state % (len(cand) - i)
            cand[i], cand[j] = cand[j], cand[i]
            sel.append(cand[i])
    elif policy == "oracle":
        s = keys @ q / np.sqrt(len(q))
        p = np.exp(s - s.max())
        p /= p.sum()
        take_top([float(p[r.start:r.stop].sum()) for r in blocks], used, k, sel)
    return sorted(sel)


def quantize_q8(x: np.ndarray) -> np.ndarray:
    """The engine's q8 round trip (groups of 32 along the last axis), as stored in the cache."""
    x = x.astype(np.float32)
    out = np.empty_like(x)
    for g in range(0, x.shape[-1], 32):
        part = x[..., g:g + 32]
        scale = (np.abs(part).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
        safe = np.where(scale > 0, scale, 1).astype(np.float32)
        inv = np.where(scale > 0, np.float32(1) / safe, 0).astype(np.float32)
        v = (part * inv).astype(np.float64)
        r = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127).astype(np.float32)
        out[..., g:g + 32] = r * scale
    return out


# ---------------------------------------------------------------------------------------------
# Running attn-bench on given inputs
# ---------------------------------------------------------------------------------------------


class Bench:
    """Q/K/V/importance for `lmc attn-bench --inputs` and what the engine did with them."""

    def __init__(self, q, k, v, importance, tmp_path):
        self.q, self.k, self.v = q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
        self.importance = importance.astype(np.float32)
        self.tmp = tmp_path
        self.path = tmp_path / "inputs.bin"
        parts = [self.q.ravel(), self.k.ravel(), self.v.ravel(), self.importance]
        np.concatenate(parts).tofile(self.path)

    @property
    def dims(self):
        return ["--ctx", self.k.shape[0], "--heads", self.q.shape[0], "--kv-heads", self.k.shape[1],
                "--head-dim", self.q.shape[1]]

    def run(self, lmc, *args, tag="run"):
        trace, out = self.tmp / f"trace-{tag}.txt", self.tmp / f"out-{tag}.bin"
        doc = lmc_json(lmc, "attn-bench", *self.dims, "--inputs", self.path, "--runs", 1,
                       "--warmup", 0, "--trace-selection", trace, "--dump-out", out, *args)
        return doc, read_trace(trace), np.fromfile(out, dtype=np.float32)


def read_trace(path) -> dict[tuple[int, int, int], list[int]]:
    """(query_pos, layer, head) -> selected block ids."""
    sel = {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        pos, layer, head, n, *ids = map(int, line.split())
        assert len(ids) == n
        sel[(pos, layer, head)] = ids
    return sel


def random_bench(tmp_path, ctx=300, heads=4, kv_heads=2, dim=16, seed=0) -> Bench:
    rng = np.random.default_rng(seed)
    return Bench(rng.uniform(-1, 1, (heads, dim)), rng.uniform(-1, 1, (ctx, kv_heads, dim)),
                 rng.uniform(-1, 1, (ctx, kv_heads, dim)), rng.uniform(0, 1, ctx), tmp_path)


# ---------------------------------------------------------------------------------------------
# The reference agrees with the engine, for every policy
# ---------------------------------------------------------------------------------------------

VARIANTS = [
    (policy, [], {}, "f32") for policy in POLICIES
] + [
    ("sparse", ["--no-importance"], {"use_importance": False}, "f32"),
    ("sparse", ["--no-recency"], {"recency": False}, "f32"),
    ("sparse", ["--probes", "3"], {"probes": 3}, "f32"),
    ("sparse", ["--probe-summary"], {"summary": True}, "f32"),
    ("quest", ["--no-recency"], {"recency": False}, "f32"),
    ("random", ["--seed", "42"], {"seed": 42}, "f32"),
    ("random", ["--no-recency", "--seed", "7"], {"recency": False, "seed": 7}, "f32"),
] + [
    # q8 KV changes what the key-reading policies see
    (policy, [], {}, "q8") for policy in ("sparse", "quest", "oracle")
]


@pytest.mark.parametrize("policy, flags, ref_args, kv", VARIANTS,
                         ids=[f"{p}{''.join(f)}-{kv}" for p, f, _, kv in VARIANTS])
def test_reference_agrees_with_trace(lmc, tmp_path, policy, flags, ref_args, kv):
    bench = random_bench(tmp_path, seed=len(flags) + 3 * POLICIES.index(policy))
    k, bs = 5, 16
    _, trace, _ = bench.run(lmc, "--attn", policy, "--k", k, "--block", bs, "--kv", kv, *flags)
    keys = quantize_q8(bench.k) if kv == "q8" else bench.k
    ctx, heads, group = len(bench.k), len(bench.q), len(bench.q) // bench.k.shape[1]
    for h in range(heads):
        want = reference_select(policy, bench.q[h], keys[:, h // group], bench.importance, k=k,
                                bs=bs, head=h, **ref_args)
        assert trace[(ctx - 1, 0, h)] == want, f"head {h}"
        assert len(want) == (19 if policy == "exact" else k)


# ---------------------------------------------------------------------------------------------
# Crafted inputs: the block-selection article's mechanisms
# ---------------------------------------------------------------------------------------------


def needle_bench(tmp_path, importance_block: int) -> Bench:
    """8 blocks of 16; a key aligned with q at position 52 (block 3, a probe position)."""
    rng = np.random.default_rng(1)
    ctx, dim = 128, 16
    k = rng.uniform(-0.1, 0.1, (ctx, 1, dim))
    v = rng.uniform(-1, 1, (ctx, 1, dim))
    q = np.zeros((1, dim))
    q[0, 0] = 8.0
    k[52, 0, :] = 0.0
    k[52, 0, 0] = 8.0
    importance = np.zeros(ctx)
    importance[importance_block * 16:(importance_block + 1) * 16] = 1.0
    return Bench(q, k, v, importance, tmp_path)


@pytest.mark.parametrize("importance_block, k, flags, want", [
    (7, 2, [], [3, 7]),            # importance keeps the last block, the probe finds the needle
    (0, 2, ["--no-recency"], [0, 3]),
    (0, 4, [], [0, 1, 3, 7]),      # recency replaces the weakest probe pick, not the needle
    (0, 1, [], [0]),               # k = 1: the only slot goes to importance; needle lost
    (0, 1, ["--no-importance"], [7]),  # k = 1 without importance: recency takes the probe slot
])
def test_needle_block(lmc, tmp_path, importance_block, k, flags, want):
    bench = needle_bench(tmp_path, importance_block)
    doc, trace, out = bench.run(lmc, "--attn", "sparse", "--k", k, "--block", 16,
                                "--measure-selection", *flags)
    assert trace[(127, 0, 0)] == want
    needle_kept = 3 in want
    # the needle dominates the softmax: its value is the output only when its block is kept
    assert (np.abs(out - bench.v[52, 0]).max() < 1e-3) == needle_kept
    assert (doc["selection"]["mass"] > 0.99) == needle_kept


@pytest.mark.parametrize("k, flags, want", [
    (4, [], [0, 1, 2, 7]),
    (4, ["--no-importance"], [0, 1, 2, 7]),
    (4, ["--no-recency"], [0, 1, 2, 3]),
    (3, [], [0, 1, 7]),
    (5, [], [0, 1, 2, 3, 7]),
])
def test_ties_go_to_the_lower_block(lmc, tmp_path, k, flags, want):
    zeros = np.zeros((128, 1, 8))
    bench = Bench(np.ones((1, 8)), zeros, zeros, np.zeros(128), tmp_path)
    _, trace, _ = bench.run(lmc, "--attn", "sparse", "--k", k, "--block", 16, *flags)
    assert trace[(127, 0, 0)] == want


@pytest.mark.parametrize("k, want", [
    (4, [0, 5, 6, 7]),  # (4+1)/2 = 2 importance blocks (6, 5); recency replaces probe pick 1
    (2, [6, 7]),        # 1 importance block; recency replaces the probe pick 0
    (1, [6]),           # nothing to replace: the importance block stays alone
    (5, [0, 4, 5, 6, 7]),  # 3 importance blocks (6, 5, 4), probes 0, 1; 1 replaced by 7
])
def test_importance_budget_and_recency(lmc, tmp_path, k, want):
    zeros = np.zeros((128, 1, 8))
    importance = np.zeros(128)
    importance[96:112] = 2.0   # block 6
    importance[80:96] = 1.0    # block 5
    importance[64:80] = 0.5    # block 4
    bench = Bench(np.ones((1, 8)), zeros, zeros, importance, tmp_path)
    _, trace, _ = bench.run(lmc, "--attn", "sparse", "--k", k, "--block", 16)
    assert trace[(127, 0, 0)] == want


@pytest.mark.parametrize("policy", POLICIES)
def test_full_budget_is_bit_identical_to_exact(lmc, tmp_path, policy):
    bench = random_bench(tmp_path, ctx=200)
    _, _, exact = bench.run(lmc, "--attn", "exact", "--block", 16, tag="exact")
    _, trace, out = bench.run(lmc, "--attn", policy, "--k", 13, "--block", 16, tag=policy)
    assert all(ids == list(range(13)) for ids in trace.values())
    assert out.tobytes() == exact.tobytes()


@pytest.mark.parametrize("flags", [[], ["--probe-summary"], ["--probes", 3], ["--probes", 4]])
def test_a_group_reads_shared_blocks_once_without_changing_a_bit(lmc, tmp_path, flags):
    # 4 query heads per KV head choose different blocks; the grouped path reads the union of
    # their blocks once (probe keys 2, 5 and 4 rows apart; the last block is partial),
    # --measure-selection runs each head on its own
    bench = random_bench(tmp_path, ctx=300, heads=8, kv_heads=2, dim=16, seed=11)
    args = ("--attn", "sparse", "--k", 5, "--block", 16, *flags)
    _, trace, grouped = bench.run(lmc, *args, tag="grouped")
    _, trace_alone, alone = bench.run(lmc, *args, "--measure-selection", tag="alone")
    assert trace == trace_alone
    chosen = [trace[(299, 0, h)] for h in range(8)]
    assert len({tuple(c) for c in chosen[:4]}) > 1 and len({tuple(c) for c in chosen[4:]}) > 1
    assert grouped.tobytes() == alone.tobytes()
    # each head attended exactly its own blocks
    q, k, v = (x.astype(np.float64) for x in (bench.q, bench.k, bench.v))
    for h, blocks in enumerate(chosen):
        pos = [p for b in blocks for p in range(b * 16, min(b * 16 + 16, 300))]
        s = k[pos, h // 4] @ q[h] / np.sqrt(16)
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ v[pos, h // 4]
        assert np.abs(grouped.reshape(8, -1)[h] - want).max() < 1e-5, h


def test_reference_attention_matches_kernel(lmc, tmp_path):
    bench = random_bench(tmp_path, ctx=1000, dim=64)
    _, _, kernel = bench.run(lmc, "--attn", "exact", tag="kernel")
    _, _, ref = bench.run(lmc, "--attn", "exact", "--ref-attn", tag="ref")
    assert np.abs(kernel - ref).max() < 1e-5
    # and both are attention: a numpy float64 softmax agrees
    q, k, v = bench.q.astype(np.float64), bench.k.astype(np.float64), bench.v.astype(np.float64)
    group = len(q) // k.shape[1]
    for h in range(len(q)):
        s = k[:, h // group] @ q[h] / np.sqrt(q.shape[1])
        p = np.exp(s - s.max())
        want = (p / p.sum()) @ v[:, h // group]
        assert np.abs(ref.reshape(len(q), -1)[h] - want).max() < 1e-5


def test_oracle_captures_the_most_mass(lmc, tmp_path):
    bench = random_bench(tmp_path, ctx=400, dim=32, seed=5)
    # sharper attention than uniform data gives, so that selections differ in mass
    bench = Bench(bench.q * 3, bench.k, bench.v, bench.importance, tmp_path)
    docs = {p: bench.run(lmc, "--attn", p, "--k", 4, "--block", 16, "--measure-selection", tag=p)[0]
            for p in POLICIES}
    mass = {p: d["selection"]["mass"] for p, d in docs.items()}
    assert mass["exact"] == pytest.approx(1.0)
    assert docs["exact"]["selection"]["max_abs_diff"] == 0
    assert docs["oracle"]["selection"]["oracle_recall"] == 1.0
    for p in POLICIES:
        if p != "exact":
            assert mass["oracle"] >= mass[p] - 1e-6, p
            if p != "oracle":  # the oracle reads every key to know the true mass
                exact_bytes = docs["exact"]["selection"]["bytes_read"]
                assert 0 < docs[p]["selection"]["bytes_read"] < exact_bytes


def test_bytes_read_accounting(lmc, tmp_path):
    bench = random_bench(tmp_path, ctx=320, heads=2, kv_heads=1, dim=16)
    row = 16 * 4  # one f32 key (or value) row of one head
    docs = {p: bench.run(lmc, "--attn", p, "--k", 4, "--block", 32, tag=p)[0]["selection"]
            for p in ("exact", "sparse", "window", "quest")}
    assert docs["exact"]["kv_bytes"] == 2 * 320 * 2 * row and docs["exact"]["select_bytes"] == 0
    assert docs["window"]["kv_bytes"] == 2 * 4 * 32 * 2 * row
    assert docs["window"]["select_bytes"] == 0
    # sparse: 8 probe keys in each of 10 blocks, read once for the GQA group of 2 heads, + the
    # importance array per head
    assert docs["sparse"]["select_bytes"] == 10 * 8 * row + 2 * 320 * 4
    assert docs["sparse"]["kv_bytes"] == 2 * 4 * 32 * 2 * row  # 4 full blocks per head
    assert docs["quest"]["select_bytes"] == 2 * 10 * 2 * row


# ---------------------------------------------------------------------------------------------
# In the model: decode-time selection, diagnostics and the trace
# ---------------------------------------------------------------------------------------------


def test_generate_measures_and_traces_selection(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", [(i * 37) % 320 for i in range(100)])
    trace = tmp_path / "trace.txt"
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 6,
                   "--attn", "sparse", "--k", 2, "--block", 16, "--measure-selection",
                   "--trace-selection", trace, "--threads", 2)
    sel = read_trace(trace)
    # 6 decode steps x 2 layers x 8 heads, each with k = 2 blocks
    assert len(sel) == 6 * 2 * 8
    assert {pos for pos, _, _ in sel} == set(range(100, 106))
    assert all(len(ids) == 2 and ids[-1] == pos // 16 for (pos, _, _), ids in sel.items())
    summary = out["selection"]
    for step in out["steps"]:
        s = step["selection"]
        assert 0 < s["mass"] <= 1 + 1e-6 and 0 <= s["oracle_recall"] <= 1 and s["max_abs_diff"] >= 0
        assert s["bytes_read"] == s["select_bytes"] + s["kv_bytes"] > 0
    assert summary["mass"] == pytest.approx(np.mean([s["selection"]["mass"] for s in out["steps"]]))

    exact = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 6,
                     "--measure-selection")
    assert exact["selection"]["mass"] == pytest.approx(1.0)
    assert exact["selection"]["max_abs_diff"] == 0 and exact["selection"]["oracle_recall"] == 1


def test_sparse_prefill_changes_attention(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", [(i * 37) % 320 for i in range(100)])
    base = ["--model", model, "--text", prompt, "--attn", "sparse", "--k", 1, "--block", 16]
    exact_prefill = lmc_json(lmc, "ppl", *base)
    sparse_prefill = lmc_json(lmc, "ppl", *base, "--prefill-attn", "sparse")
    full = lmc_json(lmc, "ppl", *base[:4], "--block", 16)
    assert exact_prefill["nll"] == full["nll"]  # ppl runs as a prefill: exact unless asked
    assert sparse_prefill["config"]["prefill_attn"] == "sparse"
    assert sparse_prefill["nll"] != full["nll"]
