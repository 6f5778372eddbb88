"""Sparse prefill a tile of queries at a time: `--prefill-attn sparse` chooses the
blocks once per tile of 64 queries (select_tile_blocks: k - 1 blocks before the tile by its
mean queries, and the tile's own), attends them with the exact tile kernel and still records
each query's probabilities as the prefill importance that sparse decode reserves blocks by.

With every block chosen the tile is exact attention: the same bits as exact prefill, and the
same importance (decode picks by it) as the token-by-token exact prefill records. Sparse's own
exact prefill (no --prefill-attn sparse) runs the same tiles over every block, with the
probabilities computed again after each tile instead of kept: the same importance, bit for
bit. With few blocks it is another attention, the same for any thread count and under
AddressSanitizer."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_engine import lmc_json, write_tokens

IDS = [(i * 37 + (i // 7) * 5) % 320 if i % 5 else 11 for i in range(150)]  # 3 chunks


def dump_run(lmc, model, prompt, tmp_path, tag: str, *extra) -> tuple[dict, np.ndarray]:
    dump = tmp_path / f"{tag}.bin"
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 32,
                   "--dump-logits", dump, "--attn", "sparse", *extra)
    return out, np.fromfile(dump, dtype=np.float32)


@pytest.mark.parametrize("name, block, kv", [("gqa4_untied_f32_old", 8, "f32"),
                                             ("odd_widths_f32", 5, "f32"),
                                             ("gqa4_untied_f32_old", 8, "q8")])
def test_tiles_choosing_every_block_give_exact_prefills_bits(lmc, tiny_model, tmp_path, name,
                                                            block, kv):
    model = tiny_model(name)
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    every = ["--k", 64, "--block", block, "--threads", 2, "--kv", kv]  # k covers every block
    tiled, tiled_logits = dump_run(lmc, model, prompt, tmp_path, "tiled", *every,
                                   "--prefill-attn", "sparse")
    exact, exact_logits = dump_run(lmc, model, prompt, tmp_path, "exact", *every)
    # the exact policy: plain tiles (no importance), and decode over every block as sparse's
    plain, plain_logits = dump_run(lmc, model, prompt, tmp_path, "plain", *every,
                                   "--attn", "exact")
    assert tiled["config"]["prefill_attn"] == "sparse" and tiled["config"]["prefill_tiles"]
    assert exact["config"]["prefill_attn"] == "exact" and exact["config"]["prefill_tiles"]
    assert tiled["tokens"] == exact["tokens"] == plain["tokens"]
    assert tiled_logits.tobytes() == exact_logits.tobytes() == plain_logits.tobytes()


def test_tiles_record_the_prefill_importance_decode_reserves_by(lmc, tiny_model, tmp_path):
    """k = 20 blocks of 8 covers the 150-token prompt (19 blocks) but not the 182 positions
    decode reaches: decode reserves (k + 1) / 2 blocks by the prefill importance, which the
    tiles sum per KV head (another float order than token by token: the same picks here).
    Sparse's exact prefill computes the probabilities again instead of keeping the scores:
    the same importance, so the same picks and bits."""
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    picks = {}
    for tag, extra in (("tiled", ["--prefill-attn", "sparse"]), ("again", []),
                       ("blind", ["--prefill-attn", "sparse", "--no-importance"])):
        trace = tmp_path / f"{tag}.trace"
        out, logits = dump_run(lmc, model, prompt, tmp_path, tag, "--k", 20, "--block", 8,
                               "--trace-selection", trace, *extra)
        assert out["config"]["prefill_tiles"]
        picks[tag] = (out["tokens"], logits.tobytes(), trace.read_text())
    assert picks["tiled"] == picks["again"]  # decode's blocks, step by step and head by head
    assert picks["blind"][1] == picks["tiled"][1]  # the same prefill
    assert picks["blind"][2] != picks["tiled"][2]  # without the reservation other blocks


def test_tiles_with_few_blocks_are_deterministic(lmc, lmc_asan, tiny_model, tmp_path):
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    args = ["ppl", "--model", model, "--text", prompt, "--attn", "sparse", "--k", 3,
            "--block", 8]
    exact = lmc_json(lmc, *args)
    runs = [lmc_json(lmc, *args, "--prefill-attn", "sparse", "--threads", threads)
            for threads in (1, 3)]
    checked = lmc_json(lmc_asan, *args, "--prefill-attn", "sparse")
    assert runs[0]["nll"] == runs[1]["nll"] == checked["nll"] != exact["nll"]
    assert runs[0]["config"]["prefill_tiles"]
    q8 = [lmc_json(binary, *args, "--prefill-attn", "sparse", "--kv", "q8", "--threads", threads)
          for binary, threads in ((lmc, 1), (lmc, 3), (lmc_asan, 2))]
    assert q8[0]["config"]["prefill_tiles"]  # q8 KV rows in the same tiles
    assert q8[0]["nll"] == q8[1]["nll"] == q8[2]["nll"] != runs[0]["nll"]
    for extra in (["--exact-first-layer"], ["--kv-budget", 64]):
        per_query = lmc_json(lmc, *args, "--prefill-attn", "sparse", *extra)
        assert not per_query["config"]["prefill_tiles"], extra  # each query selects for itself
    assert np.isfinite(runs[0]["nll"])
