"""The shipped needle model: a genuine Qwen3 checkpoint that lmc runs exactly like transformers
and that finds the needle with exact attention."""

from __future__ import annotations

import json

import pytest

from harness.engines.lmc import generator as lmc_generator
from harness.workloads import needle_prompt
from harness.workloads.grid import recall_grid, transformers_generator

MAX_WEIGHTS_BYTES = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def reference(needle_model):
    pytest.importorskip("transformers")
    return transformers_generator(needle_model)


def test_model_is_a_small_qwen3_checkpoint(needle_model):
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    config = json.loads((needle_model / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (needle_model / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES
    model = AutoModelForCausalLM.from_pretrained(needle_model)
    assert isinstance(model, Qwen3ForCausalLM)


@pytest.mark.parametrize("ctx, depth, seed", [(256, 0.5, 0), (1024, 0.2, 1), (700, 1.0, 2)])
def test_lmc_greedy_tokens_equal_transformers(lmc, needle_model, reference, ctx, depth, seed):
    prompt = needle_prompt(needle_model, ctx, depth, seed)
    engine = lmc_generator(lmc, needle_model, ["--attn", "exact", "--threads", "2"])
    expected = reference(prompt.ids, 8, prompt.stop_ids[0])
    assert engine(prompt.ids, 8, prompt.stop_ids[0]) == expected


def test_fast_recall_grid_with_exact_attention_in_lmc(lmc, needle_model):
    engine = lmc_generator(lmc, needle_model, ["--attn", "exact", "--threads", "2"])
    cells = recall_grid(engine, needle_model, ctxs=[256, 1024], depths=[0.0, 0.5, 1.0],
                        seeds=[0, 1])
    missed = [(c.ctx, c.depth, c.seed, c.answer) for c in cells if not c.found]
    assert len(cells) == 12
    assert not missed, f"needle missed at (ctx, depth, seed, answer): {missed}"
