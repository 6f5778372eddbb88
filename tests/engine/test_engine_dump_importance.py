"""`lmc generate --dump-importance FILE`: the prefill importance of every layer and layer 0's
queries, keys and (sparse prefill) blocks, written after prefill. Reading it out changes no
bit of the run, is clean under AddressSanitizer, and is refused where there is no importance.
(The recompute against it: tests/audit/test_importance_check.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_engine import assert_input_error, lmc_json, run_lmc, write_tokens

from reports.audit.importance_dump import parse_importance_dump

IDS = [(i * 37 + (i // 7) * 5) % 320 if i % 5 else 11 for i in range(150)]


def run(binary, model, prompt, tmp_path, tag: str, *extra) -> tuple[dict, bytes]:
    logits = tmp_path / f"{tag}.logits"
    out = lmc_json(binary, "generate", "--model", model, "--prompt", prompt, "--max-new", 8,
                   "--attn", "sparse", "--k", 4, "--block", 8, "--threads", 2,
                   "--dump-logits", logits, *extra)
    return out, logits.read_bytes()


@pytest.mark.parametrize("prefill", ["exact", "sparse"])
def test_the_dump_changes_no_bit_and_holds_every_layer(lmc, lmc_asan, tiny_model, tmp_path,
                                                       prefill: str) -> None:
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    plain = run(lmc, model, prompt, tmp_path, "plain", "--prefill-attn", prefill)
    dumps = []
    for tag, binary in (("release", lmc), ("asan", lmc_asan)):
        path = tmp_path / f"{tag}.txt"
        out, logits = run(binary, model, prompt, tmp_path, tag, "--prefill-attn", prefill,
                          "--dump-importance", path)
        assert out["tokens"] == plain[0]["tokens"] and logits == plain[1]
        dumps.append(path.read_text())
    assert dumps[0] == dumps[1]
    dump = parse_importance_dump(dumps[0])
    assert dump.prefill == prefill and dump.positions == len(IDS)
    assert dump.q.shape[1:] == (8, 32) and dump.k.shape[1:] == (2, 32)
    # every layer: each query's probabilities sum to 1, for each of the 8 heads
    assert np.allclose(dump.importance.sum(axis=1), 8 * len(IDS), rtol=1e-5)
    assert (dump.blocks is None) == (prefill == "exact")


def test_the_dump_is_refused_without_importance(lmc, tiny_model, tmp_path) -> None:
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    args = ["generate", "--model", model, "--prompt", prompt, "--max-new", 1]
    assert_input_error(run_lmc(lmc, *args, "--dump-importance", tmp_path / "d.txt"),
                       "--dump-importance writes the prefill importance, which --attn sparse "
                       "records (got --attn exact)")
    assert_input_error(run_lmc(lmc, *args, "--attn", "sparse", "--dump-importance",
                               tmp_path / "no" / "d.txt"), "cannot write --dump-importance file")
    assert_input_error(run_lmc(lmc, "ppl", "--model", model, "--text", prompt,
                               "--dump-importance", tmp_path / "d.txt"),
                       "unknown option '--dump-importance' for 'ppl'")
