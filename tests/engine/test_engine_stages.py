"""attn-bench's per-stage breakdown, and the fast sparse selection paths (probe keys
copied beside the cache, the importance reservation chosen once per layer, the one-pass top-k)
choosing exactly what the block-selection article's greedy rule chooses, ties and NaN scores
included."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from fixtures_engine import lmc_json
from test_engine_sparse import random_bench, reference_select

STAGES = ("probe", "importance", "select", "gather", "attend")


def stages(lmc, *policy):
    doc = lmc_json(lmc, "attn-bench", "--ctx", 2048, "--heads", 4, "--kv-heads", 2,
                   "--head-dim", 64, "--runs", 3, "--stages", *policy)
    return doc["stages"]


def test_stages_split_the_step(lmc):
    exact, sparse = stages(lmc, "--attn", "exact"), stages(lmc, "--attn", "sparse", "--k", 8)
    for doc in (exact, sparse):
        assert set(doc["ms"]) == set(STAGES) and min(doc["ms"].values()) >= 0
        # the stages are parts of the pass: together no longer than it (timer rounding aside)
        assert sum(doc["ms"].values()) <= doc["mean_ms"] * 1.05 + 1e-3
        assert doc["ms"]["attend"] > 0 and isinstance(doc["minor_faults"], int)
    assert exact["ms"]["probe"] == exact["ms"]["importance"] == 0  # exact selects nothing
    assert sparse["ms"]["probe"] > 0 and sparse["ms"]["importance"] > 0


def test_stages_change_no_output(lmc, tmp_path):
    bench = random_bench(tmp_path, ctx=700, heads=6, kv_heads=2, dim=32, seed=9)
    outs = [bench.run(lmc, "--attn", "sparse", "--k", 6, "--block", 16, "--threads", threads,
                      *flags, tag=f"{threads}{len(flags)}")[1:]
            for threads, flags in ((1, []), (1, ["--stages"]), (3, ["--stages"]))]
    for trace, out in outs[1:]:
        assert trace == outs[0][0] and out.tobytes() == outs[0][1].tobytes()


@pytest.mark.parametrize("policy", [["--attn", "exact"], ["--attn", "sparse", "--k", 6]])
def test_layers_in_turn_attend_the_same_data(lmc, tmp_path, policy):
    """--layers N: N copies of the layer attended in turn each pass (KV from memory, as in
    decode) give the one layer's output bit for bit, and the times and stages stay per layer."""
    bench = random_bench(tmp_path, ctx=700, heads=6, kv_heads=2, dim=32, seed=4)
    one_doc, one_trace, one = bench.run(lmc, *policy, "--block", 16, tag="one")
    doc, trace, out = bench.run(lmc, *policy, "--block", 16, "--layers", 3, "--stages", "--runs", 4,
                                tag="three")
    assert one_doc["layers"] == 1 and doc["layers"] == 3 and len(doc["runs"]) == 4
    assert trace == one_trace and out.tobytes() == one.tobytes()
    st = doc["stages"]
    assert st["mean_ms"] == pytest.approx(sum(doc["runs"]) / 4, rel=1e-3, abs=1e-4)
    # per layer: the stages (summed over the 3 layers, divided by them) fit inside the pass
    assert 0 < sum(st["ms"].values()) <= st["mean_ms"] * 1.05 + 1e-3


def test_layers_is_checked(lmc):
    proc = subprocess.run([str(lmc), "attn-bench", "--ctx", "64", "--heads", "2", "--kv-heads", "1",
                           "--head-dim", "8", "--layers", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--layers" in proc.stderr


@pytest.mark.parametrize("k, flags, ref_args", [
    (7, [], {}),
    (7, ["--no-importance"], {"use_importance": False}),
    (12, ["--probes", "3"], {"probes": 3}),
])
def test_ties_and_nan_scores_pick_as_the_greedy_rule(lmc, tmp_path, k, flags, ref_args):
    """Blocks with identical keys tie on their probe score and blocks with equal importance tie
    on it (the lower index wins); a NaN importance block orders nothing, and the greedy scans
    decide then, as in the block-selection article's rule."""
    bench = random_bench(tmp_path, ctx=600, heads=4, kv_heads=2, dim=16, seed=5)
    bs = 16
    for b in (3, 9, 20, 30):  # four blocks with the same keys: equal probe scores
        bench.k[b * bs:(b + 1) * bs] = bench.k[5 * bs:6 * bs]
    bench.importance[:] = np.repeat(np.arange(len(bench.importance) // 50 + 1) % 4, 50)[
        :len(bench.importance)].astype(np.float32)
    bench.importance[1 * bs + 3] = np.nan  # early: among the first blocks a pass keeps
    bench.__init__(bench.q, bench.k, bench.v, bench.importance, tmp_path)  # rewrite the file
    _, trace, _ = bench.run(lmc, "--attn", "sparse", "--k", k, "--block", bs, *flags)
    ctx, group = len(bench.k), len(bench.q) // bench.k.shape[1]
    for h in range(len(bench.q)):
        want = reference_select("sparse", bench.q[h], bench.k[:, h // group], bench.importance,
                                k=k, bs=bs, head=h, **ref_args)
        assert trace[(ctx - 1, 0, h)] == want, f"head {h}"
