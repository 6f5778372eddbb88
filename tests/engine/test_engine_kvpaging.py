"""The paged KV cache: --kv-budget gives evicted blocks' memory back.

Each policy's eviction, paged, against the same run with --kv-keep-evicted (the masking alone,
evicted rows left in memory): bit-identical tokens, logits and nll. A released block reads as
NaN (engine/kvcache.h), so a read of any evicted row would show in these outputs. The memory
figures follow the budget: at most budget / block + 1 blocks per query head held, the union of
a KV head's query heads, and the slots touched are the ones reused."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_engine import TINY_SPECS, lmc_json, run_lmc, write_tokens

MODEL = "gqa4_untied_f32_old"  # 8 query heads over 2 KV heads, 2 layers, vocabulary 320
IDS = [(i * 37 + (i // 7) * 5) % 320 if i % 5 else 11 for i in range(120)]
BLOCK, BUDGET = 8, 32
POLICIES = ["window", "h2o", "h2o-prev", "random", "sparse", "quest", "oracle"]


def budget_args(policy: str, *extra: str) -> list[str]:
    return ["--attn", policy, "--kv-budget", str(BUDGET), "--block", str(BLOCK),
            "--prefill-attn", "sparse", *extra]


@pytest.mark.parametrize("policy", POLICIES)
def test_paged_eviction_gives_the_masked_outputs(lmc, tiny_model, tmp_path, policy):
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    runs = {}
    for mode, extra in (("paged", ()), ("kept", ("--kv-keep-evicted",))):
        dump = tmp_path / f"{mode}.bin"
        gen = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 16,
                       "--dump-logits", dump, *budget_args(policy, *extra))
        ppl = lmc_json(lmc, "ppl", "--model", model, "--text", prompt, "--threads", 2,
                       *budget_args(policy, *extra))
        runs[mode] = (gen, ppl, np.fromfile(dump, dtype=np.float32))
    (gen, ppl, logits), (kgen, kppl, klogits) = runs["paged"], runs["kept"]
    assert gen["tokens"] == kgen["tokens"] and logits.tobytes() == klogits.tobytes()
    assert ppl["nll"] == kppl["nll"] and np.isfinite(ppl["nll"])
    assert gen["kv_memory"]["paged"] and not kgen["kv_memory"]["paged"]
    spec = TINY_SPECS[MODEL]
    heads = spec.layers * spec.kv_heads
    mem, kept = gen["kv_memory"], kgen["kv_memory"]
    block = mem["block_bytes"]
    assert block == 2 * BLOCK * spec.head_dim * 4  # K and V rows of one block, f32
    positions = len(IDS) + 16 - 1  # the last generated token is not fed back
    assert kept["resident_bytes"] == heads * -(-positions // BLOCK) * block
    # a query head keeps budget / block blocks and the newest; a KV head the union of its
    # query heads' (one head's worth when they agree, as window's do)
    group = spec.heads // spec.kv_heads
    most = (BUDGET // BLOCK + 1) * (1 if policy == "window" else group)
    assert mem["peak_live_bytes"] <= heads * most * block
    assert mem["live_bytes"] <= mem["peak_live_bytes"] <= mem["resident_bytes"]
    assert mem["resident_bytes"] < kept["resident_bytes"]
    assert mem["allocated_bytes"] == kept["allocated_bytes"] > 0


@pytest.mark.parametrize("kv", ["f32", "q8"])
@pytest.mark.parametrize("policy", ["window", "h2o", "quest", "random", "oracle"])
def test_budget_prefill_tiles_give_the_token_by_token_bits(lmc, tiny_model, tmp_path, policy, kv):
    """Under a budget, prefill without prefill importance or key features attends a block's
    queries as one tile (they keep the same blocks: eviction happens at a block's first query;
    h2o adds their probabilities to the mass after the tile); --dump-features attends token by
    token. The prompt's and decode's logits, the nll and the slots held agree bit for bit:
    blocks of 8 (a chunk of 64 is 8 blocks), of 12 (a chunk ends mid-block) and
    --exact-first-layer; the GQA group's heads keep different blocks under h2o, quest, random
    and oracle (they then attend in passes of their own)."""
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    features = tmp_path / "features.bin"
    for block, extra in (("8", ()), ("12", ()), ("8", ("--exact-first-layer",))):
        args = ["--attn", policy, "--kv-budget", str(BUDGET), "--block", block, "--prefill-attn",
                "sparse", "--kv", kv, *extra]
        runs = {}
        modes = (("tiled", ("--threads", "3")), ("single", ("--dump-features", features)))
        for mode, more in modes:
            dump = tmp_path / f"{mode}.bin"
            gen = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 8,
                           "--dump-logits", dump, *args, *more)
            ppl = lmc_json(lmc, "ppl", "--model", model, "--text", prompt, *args, *more)
            runs[mode] = (gen, ppl, np.fromfile(dump, dtype=np.float32).tobytes())
        (gen, ppl, logits), (sgen, sppl, slogits) = runs["tiled"], runs["single"]
        assert gen["config"]["prefill_tiles"] and not sgen["config"]["prefill_tiles"], extra
        assert logits == slogits and gen["tokens"] == sgen["tokens"], (block, extra)
        assert ppl["nll"] == sppl["nll"] and np.isfinite(ppl["nll"]), (block, extra)
        # each KV head holds and releases the same slots in the same order; the peak over all
        # heads is not compared: token by token a position runs through every layer in turn
        for doc, sdoc in ((gen, sgen), (ppl, sppl)):
            mem, smem = dict(doc["kv_memory"]), dict(sdoc["kv_memory"])
            assert mem.pop("peak_live_bytes") > 0 and smem.pop("peak_live_bytes") > 0
            assert mem == smem, (block, extra)


def test_budget_prefill_of_sparse_runs_token_by_token(lmc, tiny_model, tmp_path):
    """sparse adds each prefill query's attention, head after head, to the layer's importance:
    a tile would add it in another order, so its prefill under a budget attends token by
    token."""
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    out = lmc_json(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt,
                   *budget_args("sparse"))
    assert not out["config"]["prefill_tiles"]


def test_paged_q8_cache_and_threads_give_the_same_bits(lmc, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    outs = [lmc_json(lmc, "ppl", "--model", model, "--text", prompt, "--kv", "q8",
                     "--threads", threads, *budget_args("h2o", *extra))
            for threads, extra in ((1, ()), (3, ()), (1, ("--kv-keep-evicted",)))]
    assert outs[0]["nll"] == outs[1]["nll"] == outs[2]["nll"]
    assert outs[0]["kv_memory"]["resident_bytes"] < outs[2]["kv_memory"]["resident_bytes"]


def test_exact_cache_holds_what_was_written(lmc, tiny_model, tmp_path):
    spec = TINY_SPECS[MODEL]
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    out = lmc_json(lmc, "generate", "--model", tiny_model(MODEL), "--prompt", prompt,
                   "--max-new", 0, "--block", BLOCK)
    mem = out["kv_memory"]
    blocks = spec.layers * spec.kv_heads * -(-len(IDS) // BLOCK)
    assert not mem["paged"]
    assert mem["resident_bytes"] == mem["live_bytes"] == mem["peak_live_bytes"] == \
        blocks * mem["block_bytes"]
    # the whole context is reserved, not touched
    assert mem["allocated_bytes"] >= 2 * spec.layers * out["config"]["ctx"] * \
        spec.kv_heads * spec.head_dim * 4
    assert out["peak_rss_kb"] > 0


def test_keep_evicted_needs_a_budget(lmc, tiny_model, tmp_path):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt,
                   "--kv-keep-evicted")
    assert proc.returncode == 2 and "--kv-keep-evicted needs --kv-budget" in proc.stderr


def test_prefault_makes_the_whole_cache_resident_and_changes_no_bit(lmc, tiny_model, tmp_path):
    """--kv-prefault writes every page of the cache at start (as llama.cpp clears its KV
    buffer when it makes its context), so the process's peak holds the whole reserved cache,
    not just the rows the run wrote; the tokens and logits are the same bits. The run stops at
    its first token, in a cache sized for 64000 more: about 66 MB reserved, 0.1 MB written.
    Without the flag the process's peak comes before the cache (about 15 MB more than the run
    holds after it, here), so not all of the cache shows as a difference of peaks: half must."""
    model, prompt = tiny_model(MODEL), write_tokens(tmp_path / "p.txt", IDS)
    first = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 1)
    runs = {}
    for flags in ((), ("--kv-prefault",)):
        dump = tmp_path / f"logits-{len(flags)}.bin"
        out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 64000,
                       "--ctx", 64200, "--stop", first["tokens"][0], "--dump-logits", dump, *flags)
        runs[flags] = out, dump.read_bytes()
    (plain, plain_logits), (prefaulted, prefaulted_logits) = runs[()], runs[("--kv-prefault",)]
    assert plain["tokens"] == first["tokens"] and prefaulted["tokens"] == plain["tokens"]
    assert prefaulted_logits == plain_logits
    reserved_kb = prefaulted["kv_memory"]["allocated_bytes"] / 1024
    written_kb = plain["kv_memory"]["resident_bytes"] / 1024
    assert reserved_kb > 20 * written_kb
    assert prefaulted["peak_rss_kb"] - plain["peak_rss_kb"] > 0.5 * (reserved_kb - written_kb)


def test_prefault_and_a_budget_are_refused_together(lmc, tiny_model, tmp_path):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt, "--kv-prefault",
                   *budget_args("h2o"))
    assert proc.returncode == 2 and "--kv-prefault" in proc.stderr and "--kv-budget" in proc.stderr


def test_paged_cache_under_asan(lmc, lmc_asan, tiny_model, tmp_path):
    """Slots released, reused and the dead block read, with AddressSanitizer + UBSan watching:
    the same nll as the release build."""
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    args = ["ppl", "--model", tiny_model(MODEL), "--text", prompt, *budget_args("sparse")]
    assert lmc_json(lmc_asan, *args)["nll"] == lmc_json(lmc, *args)["nll"]


def test_adapter_keeps_the_memory_figures(lmc, tiny_model, tmp_path):
    """lmc's adapter checks kv_memory and peak_rss_kb and fills the outcome's columns from them
    (the whole kv_memory object kept in Outcome.extra)."""
    from harness.engines import adapter_of

    prompt = write_tokens(tmp_path / "p.txt", IDS)
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt,
                   *budget_args("window"))
    adapter = adapter_of("lmc")
    doc = adapter.parse(proc.stdout, "ppl")
    found = adapter.outcome("ppl", doc, adapter.figures("ppl", doc))
    assert found.extra["kv_memory"] == doc["kv_memory"] and found.extra["kv_memory"]["paged"]
    assert found.peak_rss_kb == doc["peak_rss_kb"] > 0
    assert found.kv_allocated_bytes == doc["kv_memory"]["allocated_bytes"]
    assert 0 < found.kv_resident_bytes == doc["kv_memory"]["resident_bytes"] < \
        found.kv_allocated_bytes
