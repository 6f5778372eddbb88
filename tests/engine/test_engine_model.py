"""lmc against transformers' Qwen3ForCausalLM on tiny random models: the model is right.

Logits of every prompt position within 1e-4 relative (to the largest |logit|) and the same 32
greedy tokens; thread-count invariance; q8 KV / q8 weights within their documented tolerance;
the aarch64 build under qemu; perplexity; --stop.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixtures_engine import QEMU_AARCH64, TINY_SPECS, hf_reference, lmc_json, write_tokens
from util_safetensors import read_safetensors, write_safetensors

MAX_NEW = 32
# q8 tolerances (documented in engine/README.md): max |logit difference| relative to max |logit|
Q8_KV_TOLERANCE = 0.03
Q8_WEIGHTS_TOLERANCE = 0.08
# --wq bf16 on an F32 file rounds every weight to bfloat16
BF16_WEIGHTS_TOLERANCE = 0.03


def prompt_ids(vocab: int, n: int = 40, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def generate(lmc, model: Path, prompt: Path, tmp: Path, *extra: str, tag: str = "run"):
    dump = tmp / f"logits-{tag}.bin"
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", MAX_NEW,
                   "--dump-logits", dump, *extra)
    return out, np.fromfile(dump, dtype=np.float32)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", sorted(TINY_SPECS))
def test_matches_transformers(lmc, tiny_model, tmp_path, name):
    spec = TINY_SPECS[name]
    model = tiny_model(name)
    ids = prompt_ids(spec.vocab) + [spec.vocab - 1, spec.vocab - 2]  # the last embedding rows
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    out, logits = generate(lmc, model, prompt, tmp_path)
    ref_logits, ref_tokens = hf_reference(model, ids, MAX_NEW)

    assert out["schema"] == "lmc/1" and out["command"] == "generate"
    assert out["prompt_tokens"] == len(ids)
    assert out["config"]["model_config"]["head_dim"] == spec.head_dim
    assert out["config"]["model_config"]["tied_embeddings"] == spec.tied
    file_dtype = "BF16" if spec.dtype == "bfloat16" else "F32"
    assert out["config"]["model_config"]["weights_dtype"] == file_dtype
    logits = logits.reshape(len(ids), spec.vocab)
    assert rel_err(logits, ref_logits) < 1e-4
    assert out["tokens"] == ref_tokens
    assert len(out["steps"]) == MAX_NEW
    assert [s["token"] for s in out["steps"]] == out["tokens"]
    assert all(s["ms"] >= s["attn_ms"] >= 0 for s in out["steps"])
    assert out["decode_ms_per_token"] > 0 and out["prefill_ms"] > 0


def as_half_values(source: Path, out_dir: Path, dtype: str) -> Path:
    """source's F32 checkpoint with every value rounded to float16, stored as dtype (F16, or
    F32 holding the same values)."""
    out_dir.mkdir()
    shutil.copy(source / "config.json", out_dir / "config.json")
    header, data = read_safetensors(source / "model.safetensors")
    tensors, blobs, offset = {}, [], 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        half = np.frombuffer(data[begin:end], dtype=np.float32).astype(np.float16)
        blob = (half if dtype == "F16" else half.astype(np.float32)).tobytes()
        tensors[name] = {"dtype": dtype, "shape": entry["shape"],
                         "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    write_safetensors(out_dir / "model.safetensors", tensors, b"".join(blobs))
    return out_dir


@pytest.mark.parametrize("name", ["gqa1_tied_f32", "gqa4_untied_f32_old"])
def test_f16_checkpoint_gives_the_bits_of_its_values_in_f32(lmc, tiny_model, tmp_path, name):
    """F16 widens exactly: the embedding rows lmc reads from the file per lookup, and every
    matrix converted at load, give the bits of an F32 file holding the same values."""
    spec = TINY_SPECS[name]
    models = {dtype: as_half_values(tiny_model(name), tmp_path / dtype, dtype)
              for dtype in ("F16", "F32")}
    ids = prompt_ids(spec.vocab) + [spec.vocab - 1]  # the last embedding row
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    for wq in ("f32", "q8"):
        runs = {dtype: generate(lmc, model, prompt, tmp_path, "--wq", wq, tag=f"{dtype}-{wq}")
                for dtype, model in models.items()}
        assert runs["F16"][0]["config"]["model_config"]["weights_dtype"] == "F16"
        assert runs["F16"][0]["tokens"] == runs["F32"][0]["tokens"]
        assert np.array_equal(runs["F16"][1], runs["F32"][1])


def test_threads_give_identical_output(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320, n=70))
    for policy, wq in (("exact", "f32"), ("sparse", "f32"), ("exact", "q8")):
        runs = [generate(lmc, model, prompt, tmp_path, "--threads", t, "--attn", policy,
                         "--k", "1", "--block", "16", "--wq", wq, tag=f"{policy}{wq}{t}")
                for t in (1, 2, 3)]
        first_out, first_logits = runs[0]
        for out, logits in runs[1:]:
            assert out["tokens"] == first_out["tokens"]
            assert logits.tobytes() == first_logits.tobytes()


def test_reference_attention_matches_kernel(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa2_untied_bf16")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    kernel_out, kernel_logits = generate(lmc, model, prompt, tmp_path, tag="kernel")
    ref_out, ref_logits = generate(lmc, model, prompt, tmp_path, "--ref-attn", tag="ref")
    assert rel_err(kernel_logits, ref_logits) < 1e-5
    assert kernel_out["tokens"] == ref_out["tokens"]


def test_q8_kv_and_weights_within_tolerance(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa4_untied_f32_old")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    _, f32 = generate(lmc, model, prompt, tmp_path, tag="f32")
    q8_out, q8_kv = generate(lmc, model, prompt, tmp_path, "--kv", "q8", tag="kvq8")
    wq_out, q8_w = generate(lmc, model, prompt, tmp_path, "--wq", "q8", tag="wq8")
    assert q8_out["config"]["kv"] == "q8" and wq_out["config"]["wq"] == "q8"
    assert 0 < rel_err(q8_kv, f32) < Q8_KV_TOLERANCE
    assert 0 < rel_err(q8_w, f32) < Q8_WEIGHTS_TOLERANCE


def test_q8_weight_quads_at_the_layout_edges(lmc, tiny_model, tmp_path):
    # q8 weights stored in quads of rows: 70 and 318 rows (rows % 4 left plain), rows of 2 or
    # 3 blocks (fewer than the kernel's 8-block step), the tied lm_head a q8 copy
    model = tiny_model("odd_widths_tied_bf16")
    vocab = TINY_SPECS["odd_widths_tied_bf16"].vocab
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(vocab))
    _, f32 = generate(lmc, model, prompt, tmp_path, tag="f32")
    _, q8 = generate(lmc, model, prompt, tmp_path, "--wq", "q8", tag="wq8")
    assert 0 < rel_err(q8, f32) < Q8_WEIGHTS_TOLERANCE


def test_bf16_weights(lmc, tiny_model, tmp_path):
    """--wq bf16 keeps a BF16 file's weights as stored (same bits as f32); rounds an F32 file."""
    for name in ("gqa2_untied_bf16", "odd_widths_tied_bf16"):
        prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(TINY_SPECS[name].vocab))
        model = tiny_model(name)
        f32_out, f32 = generate(lmc, model, prompt, tmp_path, tag=f"f32{name}")
        bf_out, bf = generate(lmc, model, prompt, tmp_path, "--wq", "bf16", "--threads", "3",
                              tag=f"bf16{name}")
        assert bf_out["config"]["wq"] == "bf16"
        assert bf.tobytes() == f32.tobytes() and bf_out["tokens"] == f32_out["tokens"]
    model = tiny_model("gqa1_tied_f32")
    _, f32 = generate(lmc, model, prompt, tmp_path, tag="f32file")
    _, bf = generate(lmc, model, prompt, tmp_path, "--wq", "bf16", tag="bf16file")
    assert 0 < rel_err(bf, f32) < BF16_WEIGHTS_TOLERANCE


@pytest.mark.parametrize("wq", ["f32", "q8", "bf16"])
def test_prefill_chunks_do_not_change_bits(lmc, tiny_model, tmp_path, wq):
    """A prompt's logits do not depend on how prefill batches it: 70 tokens run as chunks of
    64 + 6, their first 41 as one chunk of 41 (other kernel tiles), same bits."""
    model = tiny_model("odd_widths_f32")
    ids = prompt_ids(320, n=70)
    logits = {}
    for n in (70, 41):
        prompt = write_tokens(tmp_path / f"prompt{n}.txt", ids[:n])
        _, out = generate(lmc, model, prompt, tmp_path, "--wq", wq, "--threads", "2",
                          tag=f"{wq}{n}")
        logits[n] = out.reshape(n, 320)
    assert logits[70][:41].tobytes() == logits[41].tobytes()


@pytest.mark.parametrize("wq", ["f32", "q8", "bf16"])
def test_prefill_chunks_give_token_by_token_bits(lmc, tiny_model, tmp_path, wq):
    """The weight products of a prefill chunk (matmul.c's prefill panels and tiles) give each
    token the bits of the one-token product decode runs: --dump-features makes lmc run its
    prompt one token at a time, and the prompt's logits agree bit for bit (70 tokens: a
    chunk of 64 and one of 6; odd widths: every quad, tail row and tail column path)."""
    model = tiny_model("odd_widths_f32")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320, n=70))
    _, chunked = generate(lmc, model, prompt, tmp_path, "--wq", wq, tag="chunked")
    _, single = generate(lmc, model, prompt, tmp_path, "--wq", wq, "--dump-features",
                         tmp_path / "features.bin", tag="single")
    assert (tmp_path / "features.bin").stat().st_size > 0  # the token-by-token runner ran
    assert chunked[:70 * 320].tobytes() == single[:70 * 320].tobytes()


def test_aarch64_under_qemu_matches_x86(lmc, engine_build_aarch64, tiny_model, tmp_path):
    if not shutil.which(QEMU_AARCH64[0]):
        pytest.skip("qemu-aarch64-static is not installed (scripts/setup.sh installs it)")
    arm = [*QEMU_AARCH64, engine_build_aarch64.binary]
    info = lmc_json(arm, "info")
    assert info["arch"] == "aarch64" and "neon" in info["simd"]
    assert info["source_hash"] == engine_build_aarch64.source_hash
    model = tiny_model("gqa2_untied_bf16")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    x86, x86_logits = generate(lmc, model, prompt, tmp_path, tag="x86")
    a64, a64_logits = generate(arm, model, prompt, tmp_path, tag="a64")
    assert a64["tokens"] == x86["tokens"]
    # same reduction order on both targets; libm's expf may still differ in the last bit
    assert rel_err(a64_logits, x86_logits) < 1e-5
    # the q8 weight kernels (sdot on NEON, maddubs on AVX2) sum exactly, then share one order
    x86, x86_logits = generate(lmc, model, prompt, tmp_path, "--wq", "q8", tag="x86q8")
    a64, a64_logits = generate(arm, model, prompt, tmp_path, "--wq", "q8", tag="a64q8")
    assert a64["tokens"] == x86["tokens"]
    assert rel_err(a64_logits, x86_logits) < 1e-5
    # the packed bf16 kernels (16-column pairs, 8-column block, tails) on NEON
    model = tiny_model("odd_widths_tied_bf16")
    vocab = TINY_SPECS["odd_widths_tied_bf16"].vocab
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(vocab))
    x86, x86_logits = generate(lmc, model, prompt, tmp_path, "--wq", "bf16", tag="x86bf")
    a64, a64_logits = generate(arm, model, prompt, tmp_path, "--wq", "bf16", tag="a64bf")
    assert a64["tokens"] == x86["tokens"]
    assert rel_err(a64_logits, x86_logits) < 1e-5


def test_info_reports_the_build(lmc, engine_build):
    info = lmc_json(lmc, "info")
    assert info["command"] == "info" and info["arch"] == "x86_64"
    assert info["source_hash"] == engine_build.source_hash
    assert info["compiler"] == engine_build.compiler_version
    assert "-O3" in info["flags"] and "avx2" in info["simd"]


def test_ppl_matches_transformers(lmc, tiny_model, tmp_path):
    import torch
    from transformers import Qwen3ForCausalLM

    model_dir = tiny_model("gqa1_tied_f32")
    ids = prompt_ids(320, n=30, seed=11)
    text = write_tokens(tmp_path / "text.txt", ids)
    out = lmc_json(lmc, "ppl", "--model", model_dir, "--text", text)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert out["command"] == "ppl" and out["tokens"] == len(ids) and out["scored"] == len(ids) - 1
    assert out["nll"] == pytest.approx(loss, rel=1e-4)
    assert out["ppl"] == pytest.approx(math.exp(loss), rel=1e-4)


def test_prompt_from_standard_input(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa1_tied_f32")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    from_file = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 4)
    with prompt.open() as stdin:
        proc = subprocess.run([str(lmc), "generate", "--model", str(model), "--prompt", "-",
                               "--max-new", "4"], stdin=stdin, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from_stdin = json.loads(proc.stdout)
    assert from_stdin["prompt_tokens"] == from_file["prompt_tokens"] == 40
    assert from_stdin["tokens"] == from_file["tokens"]
    empty = subprocess.run([str(lmc), "generate", "--model", str(model), "--prompt", "-"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert empty.returncode == 2 and "lmc: error:" in empty.stderr


def test_stop_token_ends_generation(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa1_tied_f32")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    full = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 8)
    stop = full["tokens"][3]
    first = full["tokens"].index(stop)
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 8,
                   "--stop", 300, "--stop", stop)
    assert out["tokens"] == full["tokens"][: first + 1]
    assert out["stop_reason"] == "stop" and full["stop_reason"] == "max_new"
    assert out["config"]["stop"] == [300, stop]


def test_generation_stops_at_the_context(lmc, tiny_model, tmp_path):
    model = tiny_model("gqa1_tied_f32")
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320, n=10))
    out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 50,
                   "--ctx", 16)
    assert len(out["tokens"]) == 6 and out["stop_reason"] == "context"
    json.dumps(out)  # the document is plain JSON


@pytest.mark.parametrize("kv", ["f32", "q8"])
@pytest.mark.parametrize("name", ["gqa4_untied_f32_old", "odd_widths_f32"])
def test_prefill_tiles_give_the_token_by_token_bits(lmc, tiny_model, tmp_path, name, kv):
    """Exact prefill runs a chunk's queries a tile at a time (attn_causal_tile), f32 and q8 KV
    alike; --dump-features records each query's probabilities, so it attends token by token:
    the prompt's logits agree bit for bit (70 tokens: a full chunk and a part; blocks of 8 and
    of 5)."""
    ids = prompt_ids(320, n=70)
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    for block in ("8", "5"):
        out, tiled = generate(lmc, tiny_model(name), prompt, tmp_path, "--block", block,
                              "--kv", kv, "--threads", "2", tag=f"tiled{block}")
        assert out["config"]["prefill_tiles"]
        _, single = generate(lmc, tiny_model(name), prompt, tmp_path, "--block", block, "--kv", kv,
                             "--dump-features", tmp_path / "features.bin", tag=f"single{block}")
        assert (tmp_path / "features.bin").stat().st_size > 0  # the token-by-token runner ran
        assert tiled[:70 * 320].tobytes() == single[:70 * 320].tobytes()
