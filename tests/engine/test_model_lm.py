"""The shipped language model (models/pydoc-lm): transformers and lmc agree on it, its tokenizer
round-trips, and it predicts its held-out text far better than uniform guessing, and worse
when h2o or random selection restrict attention to a 25 % KV budget (the model card's figures,
on one window each)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_engine import lmc_json

from harness.workloads import ids_text, load_tokenizer, ppl_tokens
from reports.audit.checks_ppl import MAX_FRACTION_OF_UNIFORM

LM = Path(__file__).resolve().parents[2] / "models" / "pydoc-lm"
HELDOUT = LM / "heldout.txt"


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[int], Path]:
    """The first 1024-token window of the held-out text, as ids and as an lmc --text file."""
    ids = ppl_tokens(LM, 1024, seed=0, text=HELDOUT).ids
    path = tmp_path_factory.mktemp("lm") / "ids.txt"
    path.write_text(ids_text(ids))
    return ids, path


def test_tokenizer_round_trips_and_matches_transformers() -> None:
    from transformers import AutoTokenizer

    text = HELDOUT.read_text(encoding="utf-8")[:20_000]
    ours = load_tokenizer(LM)
    ids = ours.encode(text)
    assert ours.decode(ids) == text  # byte-level BPE: exact round trip
    assert AutoTokenizer.from_pretrained(LM).encode(text, add_special_tokens=False) == ids
    assert len(ids) < len(text) / 2.5  # merges learnt: well under one token per 2.5 characters


def test_lmc_ppl_matches_transformers(lmc: Path, window: tuple[list[int], Path]) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    ids, path = window
    ids, text = ids[:512], path.parent / "ids512.txt"
    text.write_text(ids_text(ids))
    out = lmc_json(lmc, "ppl", "--model", LM, "--text", text, "--threads", "2")
    model = Qwen3ForCausalLM.from_pretrained(LM, dtype=torch.float32).eval()
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert out["nll"] == pytest.approx(loss, rel=1e-4)


def test_far_below_uniform_and_worse_at_a_quarter_budget(lmc: Path,
                                                         window: tuple[list[int], Path]) -> None:
    _, path = window
    exact = lmc_json(lmc, "ppl", "--model", LM, "--text", path, "--threads", "2")
    vocab = exact["config"]["model_config"]["vocab_size"]
    assert exact["ppl"] < MAX_FRACTION_OF_UNIFORM * vocab
    budget = ["--k", "8", "--block", "32", "--prefill-attn", "sparse", "--threads", "2"]
    costs = {}
    for policy in ("h2o", "random"):
        out = lmc_json(lmc, "ppl", "--model", LM, "--text", path, "--attn", policy, *budget)
        costs[policy] = out["ppl"] / exact["ppl"] - 1
    # The card: +7 % (random) and +13 % (h2o) on this window; a model that ignored everything
    # but its own block would not lose 2 % to either.
    assert costs["random"] > 0.02 and costs["h2o"] > 0.02, costs
