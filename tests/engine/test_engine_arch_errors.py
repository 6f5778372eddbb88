"""What lmc refuses among the architectures besides Qwen3 and sharded checkpoints: exit 2
and one stderr line naming the file, key or tensor — under ASan + UBSan, as
test_engine_errors."""

from __future__ import annotations

import json

import pytest
from fixtures_engine import assert_input_error, edit_config, generate
from util_safetensors import read_safetensors, shard_checkpoint, write_safetensors


@pytest.fixture
def sharded(broken):
    """test_engine_errors' writable tiny model split into three shards: (directory, index)."""
    return broken, shard_checkpoint(broken, 3)


def _as_vl(cfg: dict, **text) -> None:
    text_config = {k: v for k, v in cfg.items() if k != "model_type"} | text
    cfg.clear()
    cfg.update(model_type="qwen3_vl", text_config=text_config)


def _rope_scaling(kind: str):
    def edit(cfg: dict) -> None:
        cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
        cfg["rope_scaling"] = {"type": kind, "factor": 4.0}
    return edit


@pytest.mark.parametrize("edit, expected", [
    (lambda c: c.update(model_type="qwen3_moe", num_experts=8),
     "model_type 'qwen3_moe' is a mixture-of-experts model"),
    (lambda c: c.update(num_local_experts=8), "'num_local_experts' = 8: mixture-of-experts"),
    (lambda c: _as_vl(c, num_experts=4), "'num_experts' = 4: mixture-of-experts"),
    (lambda c: c.update(model_type="qwen3_vl"), "qwen3_vl needs the object 'text_config'"),
    (lambda c: _as_vl(c), "missing tensor 'model.language_model.embed_tokens.weight'"),
    (_rope_scaling("yarn"),
     "rope_scaling.type 'yarn' is not supported (allowed: default, llama3)"),
    (lambda c: c["rope_parameters"].update(rope_type="llama3", factor=8.0),
     "'low_freq_factor' must be a number in"),
    (lambda c: c.update(model_type="minicpm", scale_depth=1.4, dim_model_base=16),
     "'scale_emb' must be a number in"),
    (lambda c: c.update(model_type="llama", mlp_bias=True), "mlp_bias=true is not supported"),
], ids=["moe-type", "moe-experts", "vl-moe", "vl-no-text-config", "vl-tensor-prefix",
        "rope-yarn", "llama3-incomplete", "minicpm-no-scale", "mlp-bias"])
def test_unsupported_configs(lmc_asan, broken, prompt, edit, expected):
    edit_config(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt), expected)


def test_index_refuses_paths_outside_the_model(lmc_asan, sharded, prompt):
    model, index = sharded
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../elsewhere.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_input_error(generate(lmc_asan, model, prompt), "plain file name")


def test_index_names_the_wrong_shard(lmc_asan, sharded, prompt):
    model, index = sharded
    name, shard = next(iter(index["weight_map"].items()))
    index["weight_map"][name] = next(f for f in index["weight_map"].values() if f != shard)
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_input_error(generate(lmc_asan, model, prompt), f"tensor '{name}' in")


def test_missing_shard(lmc_asan, sharded, prompt):
    model, index = sharded
    shard = sorted(set(index["weight_map"].values()))[1]
    (model / shard).unlink()
    assert_input_error(generate(lmc_asan, model, prompt), f"cannot open {model / shard}")


def test_tensor_in_two_shards(lmc_asan, sharded, prompt):
    model, index = sharded
    first, second = sorted(set(index["weight_map"].values()))[:2]
    name = next(n for n, f in index["weight_map"].items() if f == first)
    src_header, src_data = read_safetensors(model / first)
    header, data = read_safetensors(model / second)
    begin, end = src_header[name]["data_offsets"]
    header[name] = dict(src_header[name], data_offsets=[len(data), len(data) + end - begin])
    write_safetensors(model / second, header, data + src_data[begin:end])
    assert_input_error(generate(lmc_asan, model, prompt), f"tensor '{name}' is in two shards")


@pytest.mark.parametrize("text", ['{"metadata": {}}', '{"weight_map": {}}', "[]", "{oops"])
def test_bad_index(lmc_asan, sharded, prompt, text):
    model, _ = sharded
    (model / "model.safetensors.index.json").write_text(text)
    expected = "invalid JSON" if text == "{oops" else "non-empty object 'weight_map'"
    assert_input_error(generate(lmc_asan, model, prompt), expected)
