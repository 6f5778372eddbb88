"""lmc on the architectures besides Qwen3: Llama (plain and with Llama 3 RoPE
scaling), the Qwen3-VL text tower from a sharded checkpoint, MiniCPM's scaling factors — each
against transformers on a tiny random model (fixtures_arch); sharded == single file; the
architecture switches keep lmc's bit-identical output across thread counts."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from fixtures_arch import ARCH_SPECS, reference_run
from fixtures_engine import lmc_json, run_lmc, write_tokens
from test_engine_model import MAX_NEW, prompt_ids, rel_err
from util_safetensors import shard_checkpoint


def lmc_generate(lmc, model, prompt, dump, *extra):
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", MAX_NEW,
                   "--dump-logits", dump, *extra)
    return out, np.fromfile(dump, dtype=np.float32)


@pytest.mark.parametrize("name", sorted(ARCH_SPECS))
def test_matches_transformers(lmc, arch_model, tmp_path, name):
    spec = ARCH_SPECS[name]
    model_dir, reference = arch_model(name)
    ids = prompt_ids(spec.vocab, n=40, seed=3) + [spec.vocab - 1]
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    ref_logits, ref_tokens, ref_nll = reference_run(reference, ids, MAX_NEW)

    out, logits = lmc_generate(lmc, model_dir, prompt, tmp_path / "logits.bin")
    mc = out["config"]["model_config"]
    assert mc["model_type"] == spec.kind
    assert mc["tied_embeddings"] == spec.tied
    assert mc["weights_dtype"] == ("BF16" if spec.dtype == "bfloat16" else "F32")
    assert rel_err(logits.reshape(len(ids), spec.vocab), ref_logits) < 1e-4
    assert out["tokens"] == ref_tokens
    ppl = lmc_json(lmc, "ppl", "--model", model_dir, "--text", prompt)
    assert ppl["nll"] == pytest.approx(ref_nll, rel=1e-4)
    assert ppl["ppl"] == pytest.approx(math.exp(ref_nll), rel=1e-4)
    # the switches (no q/k norm, scalings) leave the output independent of the thread count
    out2, logits2 = lmc_generate(lmc, model_dir, prompt, tmp_path / "logits2.bin",
                                 "--threads", "3")
    assert out2["tokens"] == out["tokens"] and logits2.tobytes() == logits.tobytes()


def test_llama3_rope_scaling_is_applied(lmc, arch_model, tmp_path):
    """The same weights read with plain RoPE no longer match: the test above sees the scaling."""
    model_dir, reference = arch_model("llama3_rope")
    plain = tmp_path / "plain"
    shutil.copytree(model_dir, plain)
    cfg = json.loads((plain / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default",
                              "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    (plain / "config.json").write_text(json.dumps(cfg))
    ids = prompt_ids(320, n=40, seed=3)
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    ref_logits, _, _ = reference_run(reference, ids, 1)
    out, logits = lmc_generate(lmc, plain, prompt, tmp_path / "logits.bin")
    assert out["config"]["model_config"]["rope_type"] == "default"
    assert rel_err(logits.reshape(len(ids), 320), ref_logits) > 1e-2


def test_qwen3_vl_notes_the_ignored_vision_tower(lmc, arch_model, tmp_path):
    model_dir, _ = arch_model("qwen3_vl")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert not (model_dir / "model.safetensors").exists()
    vision = [n for n in index["weight_map"] if n.startswith("model.visual.")]
    assert vision and len(set(index["weight_map"].values())) > 2
    prompt = write_tokens(tmp_path / "prompt.txt", [1, 2, 3])
    proc = run_lmc(lmc, "generate", "--model", model_dir, "--prompt", prompt, "--max-new", 1)
    assert proc.returncode == 0, proc.stderr
    note = proc.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("lmc: note: ")
    assert f"{len(vision)} tensors outside model.language_model." in note[0]


def test_sharded_qwen3_is_bit_identical_to_the_single_file(lmc, tiny_model, tmp_path):
    single = tiny_model("gqa2_untied_bf16")
    sharded = tmp_path / "sharded"
    shutil.copytree(single, sharded)
    shard_checkpoint(sharded, 3)
    assert not (sharded / "model.safetensors").exists()
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    for wq in ("f32", "q8"):
        a, la = lmc_generate(lmc, single, prompt, tmp_path / "a.bin", "--wq", wq)
        b, lb = lmc_generate(lmc, sharded, prompt, tmp_path / "b.bin", "--wq", wq)
        assert b["tokens"] == a["tokens"] and lb.tobytes() == la.tobytes()


def test_sharded_weights_identity(tiny_model, tmp_path):
    """The harness identifies a sharded model by its index and every shard (run keys, reproduce)."""
    from harness.errors import InputError
    from harness.identity import model_identity, weights_sha256

    model = tmp_path / "model"
    shutil.copytree(tiny_model("gqa1_tied_f32"), model)
    single = weights_sha256(model)
    index = shard_checkpoint(model, 2)
    sha, config = model_identity(model)
    assert sha != single and sha == weights_sha256(model) and config["model_type"] == "qwen3"
    shard = model / sorted(set(index["weight_map"].values()))[1]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    assert weights_sha256(model) != sha
    shard.unlink()
    with pytest.raises(InputError, match=shard.name):
        weights_sha256(model)


@pytest.mark.parametrize("name, edit", [
    # Llama 3.x files before transformers 5: rope_scaling + a top-level rope_theta
    ("llama3_rope", lambda c: c.update(rope_theta=c["rope_parameters"]["rope_theta"],
                                       rope_scaling=c.pop("rope_parameters"))),
    # Qwen3-VL as released: rope_scaling (mrope, type default) and rope_theta in text_config,
    # the tie at the top level only
    ("qwen3_vl", lambda c: (c["text_config"].update(
        rope_theta=c["text_config"]["rope_parameters"]["rope_theta"],
        rope_scaling=c["text_config"].pop("rope_parameters")),
        c["text_config"].pop("tie_word_embeddings"))),
    # MiniCPM's config class ties the embeddings unless told otherwise
    ("minicpm", lambda c: c.pop("tie_word_embeddings")),
], ids=["llama3-rope_scaling", "qwen3_vl-rope_scaling", "minicpm-tie-default"])
def test_older_config_forms_read_the_same(lmc, arch_model, tmp_path, name, edit):
    model_dir, _ = arch_model(name)
    older = tmp_path / "older"
    shutil.copytree(model_dir, older)
    cfg = json.loads((older / "config.json").read_text())
    edit(cfg)
    (older / "config.json").write_text(json.dumps(cfg))
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320, n=40, seed=3))
    a, la = lmc_generate(lmc, model_dir, prompt, tmp_path / "a.bin")
    b, lb = lmc_generate(lmc, older, prompt, tmp_path / "b.bin")
    assert b["config"]["model_config"] == a["config"]["model_config"]
    assert b["tokens"] == a["tokens"] and lb.tobytes() == la.tobytes()
