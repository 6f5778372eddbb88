"""Bad input makes lmc exit 2 with one stderr line naming the problem — never a crash.

Runs the ASan+UBSan build, so a read out of bounds or undefined behaviour fails the test even
when the message would have been right.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from fixtures_engine import BROKEN_MODEL, assert_input_error, generate, run_lmc, write_tokens
from util_safetensors import read_safetensors, write_safetensors

MODEL = BROKEN_MODEL


def edit_header(model: Path, edit) -> None:
    path = model / "model.safetensors"
    header, data = read_safetensors(path)
    edit(header, data)
    write_safetensors(path, header, data)


# ---- files -----------------------------------------------------------------------------------


def test_missing_model_dir(lmc_asan, tmp_path, prompt):
    assert_input_error(generate(lmc_asan, tmp_path / "nope", prompt), "cannot open")


def test_missing_safetensors(lmc_asan, broken, prompt):
    (broken / "model.safetensors").unlink()
    assert_input_error(generate(lmc_asan, broken, prompt),
                       "neither model.safetensors nor model.safetensors.index.json found")


@pytest.mark.parametrize("text, expected", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"model_type": "gemma"}', "model_type 'gemma' is not supported"),
])
def test_corrupt_config(lmc_asan, broken, prompt, text, expected):
    (broken / "config.json").write_text(text)
    assert_input_error(generate(lmc_asan, broken, prompt), expected)


@pytest.mark.parametrize("key, value, expected", [
    ("hidden_size", None, "missing key 'hidden_size'"),
    ("num_attention_heads", 3, "not a multiple of num_key_value_heads"),
    ("head_dim", 23, "must be even"),
    ("vocab_size", -5, "'vocab_size' must be an integer"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4},
     "rope_type 'yarn' is not supported"),
])
def test_bad_config_values(lmc_asan, broken, prompt, key, value, expected):
    cfg = json.loads((broken / "config.json").read_text())
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    (broken / "config.json").write_text(json.dumps(cfg))
    assert_input_error(generate(lmc_asan, broken, prompt), expected)


def test_file_too_short(lmc_asan, broken, prompt):
    (broken / "model.safetensors").write_bytes(b"\x01\x02")
    assert_input_error(generate(lmc_asan, broken, prompt), "too short")


def test_bad_header_length(lmc_asan, broken, prompt):
    path = broken / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])
    assert_input_error(generate(lmc_asan, broken, prompt), "bad header length")


def test_corrupt_header_json(lmc_asan, broken, prompt):
    path = broken / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[8] = ord("x")
    path.write_bytes(bytes(raw))
    assert_input_error(generate(lmc_asan, broken, prompt), "invalid JSON")


def test_truncated_file(lmc_asan, broken, prompt):
    path = broken / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 100])
    assert_input_error(generate(lmc_asan, broken, prompt), "lie outside the data section")


def test_offsets_outside_file(lmc_asan, broken, prompt):
    def edit(header, data):
        header["model.norm.weight"]["data_offsets"] = [len(data) - 4, len(data) + 124]
    edit_header(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt), "lie outside the data section")


def test_size_mismatch(lmc_asan, broken, prompt):
    def edit(header, data):
        begin, end = header["model.norm.weight"]["data_offsets"]
        header["model.norm.weight"]["data_offsets"] = [begin, end - 2]
    edit_header(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt),
                       "holds 126 bytes but shape x dtype BF16 needs 128")


@pytest.mark.parametrize("dtype, expected", [
    ("F8_E4M3", "unsupported dtype 'F8_E4M3'"),
    ("I16", "unsupported dtype I16 (allowed: F32, BF16, F16)"),
])
def test_unsupported_dtype(lmc_asan, broken, prompt, dtype, expected):
    def edit(header, data):
        header["model.norm.weight"]["dtype"] = dtype
    edit_header(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt), expected)


def test_shape_mismatch(lmc_asan, broken, prompt):
    def edit(header, data):
        header["model.layers.0.self_attn.k_proj.weight"]["shape"] = [64, 48]
    edit_header(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt),
                       "'model.layers.0.self_attn.k_proj.weight' has shape [64, 48], "
                       "config needs [48, 64]")


@pytest.mark.parametrize("name", ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"])
def test_missing_tensor(lmc_asan, broken, prompt, name):
    def edit(header, data):
        del header[name]
    edit_header(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt), f"missing tensor '{name}'")


# ---- token files and the context ---------------------------------------------------------------


def test_token_id_out_of_vocab(lmc_asan, tiny_model, tmp_path):
    bad = write_tokens(tmp_path / "p.txt", [1, 320])
    assert_input_error(generate(lmc_asan, tiny_model(MODEL), bad),
                       "token 1 has id 320, not below the vocabulary size 320")


@pytest.mark.parametrize("text, expected", [
    ("1 2 x3", "is not a decimal integer"),
    ("1 -2", "is not a decimal integer"),
    ("   \n", "holds no token ids"),
    ("99999999999", "too large"),
])
def test_bad_prompt_file(lmc_asan, tiny_model, tmp_path, text, expected):
    path = tmp_path / "p.txt"
    path.write_text(text)
    assert_input_error(generate(lmc_asan, tiny_model(MODEL), path), expected)


def test_missing_prompt_file(lmc_asan, tiny_model, tmp_path):
    proc = generate(lmc_asan, tiny_model(MODEL), tmp_path / "absent.txt")
    assert_input_error(proc, "cannot open")


def test_prompt_longer_than_context(lmc_asan, tiny_model, tmp_path):
    path = write_tokens(tmp_path / "p.txt", list(range(10)))
    assert_input_error(generate(lmc_asan, tiny_model(MODEL), path, "--ctx", 8),
                       "has 10 tokens, longer than the context of 8")


# ---- flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (["--bogus"], "unknown option '--bogus' for 'generate'"),
    (["--heads", "4"], "unknown option '--heads' for 'generate'"),
    (["--k", "0"], "--k expects an integer in [1,"),
    (["--block", "0"], "--block expects an integer in [1,"),
    (["--probes", "0"], "--probes expects an integer in [1,"),
    (["--attn", "fancy"], "--attn 'fancy' is not a policy"),
    (["--kv", "q4"], "--kv 'q4' is not allowed (allowed: f32, q8)"),
    (["--wq", "q4"], "--wq 'q4' is not allowed (allowed: f32, q8, bf16)"),
    (["--threads", "0"], "--threads expects an integer in [1, 256]"),
    (["--max-new", "-1"], "--max-new expects an integer"),
    (["--ctx", "abc"], "--ctx expects an integer"),
    (["--prefill-attn", "fast"], "--prefill-attn 'fast' is not allowed"),
    (["--seed", "-3"], "--seed expects a non-negative integer"),
    (["--k"], "--k needs a value"),
    (["--stop", "320"], "--stop 320 is not below the vocabulary size 320"),
    (["--probe-summary"], "--probe-summary applies to --attn sparse only"),
])
def test_bad_flags(lmc_asan, tiny_model, prompt, args, expected):
    assert_input_error(generate(lmc_asan, tiny_model(MODEL), prompt, *args), expected)


@pytest.mark.parametrize("args, expected", [
    ([], "no command given"),
    (["serve"], "unknown command 'serve'"),
    (["info", "--x"], "unknown option '--x' for 'info'"),
    (["generate", "--prompt", "p"], "generate needs --model DIR"),
    (["attn-bench", "--ctx", "64"], "attn-bench needs --ctx, --heads, --kv-heads and --head-dim"),
    (["attn-bench", "--ctx", "64", "--heads", "3", "--kv-heads", "2", "--head-dim", "8"],
     "--heads 3 is not a multiple of --kv-heads 2"),
    (["attn-bench", "--ctx", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
      "--attn", "sparse", "--k", "0"], "--k expects an integer in [1,"),
])
def test_bad_commands(lmc_asan, args, expected):
    assert_input_error(run_lmc(lmc_asan, *args), expected)


def test_attn_bench_inputs_of_wrong_size(lmc_asan, tmp_path):
    path = tmp_path / "in.bin"
    path.write_bytes(b"\0" * 12)
    proc = run_lmc(lmc_asan, "attn-bench", "--ctx", "4", "--heads", "1", "--kv-heads", "1",
                   "--head-dim", "2", "--inputs", path)
    assert_input_error(proc, "has 12 bytes; q, k, v and importance need 88")


def test_valid_run_is_clean_under_sanitizers(lmc_asan, tiny_model, prompt, tmp_path):
    """The same binary runs a valid model cleanly with every policy (no sanitizer report)."""
    for policy in ("exact", "sparse", "window", "h2o", "quest", "random", "oracle"):
        proc = generate(lmc_asan, tiny_model(MODEL), prompt, "--attn", policy, "--k", "1",
                        "--block", "2", "--measure-selection", "--kv", "q8",
                        "--trace-selection", tmp_path / "trace.txt", "--prefill-attn", "sparse")
        assert proc.returncode == 0, proc.stderr
        assert len(json.loads(proc.stdout)["tokens"]) == 2


def test_fuzz_target_builds_and_runs(tmp_path):
    """The libFuzzer target (engine/fuzz) builds and survives a short run on its seeds."""
    import subprocess
    import sys

    if not shutil.which("clang"):
        pytest.skip("clang is not installed (scripts/setup.sh installs it)")
    engine = Path(__file__).resolve().parents[2] / "engine"
    sources = ["fuzz/fuzz_loader.c", "json.c", "safetensors.c", "checkpoint.c", "config.c",
               "loader.c", "ops.c", "matmul.c", "acts.c", "rows.c", "weights.c", "util.c",
               "threads.c", "kvcache.c", "attend_setup.c", "attend_heads.c", "attend_layer.c",
               "attend_tile.c", "attn_kernel.c", "select.c", "policy.c", "keyfeat.c", "keyrank.c",
               "evict.c", "predictor.c"]
    binary = tmp_path / "fuzz_loader"
    build = subprocess.run(
        ["clang", "-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
         f"-I{engine}", *[str(engine / s) for s in sources], "-o", str(binary), "-lm", "-lpthread"],
        capture_output=True, text=True)
    if build.returncode != 0 and "fuzzer" in build.stderr:
        pytest.skip(f"clang has no libFuzzer here: {build.stderr[-200:]}")
    assert build.returncode == 0, build.stderr
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(engine / "fuzz" / "make_corpus.py"), str(corpus)],
                   check=True)
    run = subprocess.run([str(binary), "-runs=3000", "-max_len=8192", str(corpus)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Done 3000 runs" in run.stderr
