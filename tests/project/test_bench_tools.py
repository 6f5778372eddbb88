"""The performance benches' building blocks: the STREAM kernel, the random model, GGUF, bytes."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import attention  # noqa: E402
import gguf_convert  # noqa: E402
import prefill  # noqa: E402
import qwen3_06b  # noqa: E402
import roofline  # noqa: E402
import scale_grow  # noqa: E402
import vs_llamacpp  # noqa: E402
import weight_stream  # noqa: E402

from devices import isa  # noqa: E402
from harness.engines.lmc.build import build_c_program  # noqa: E402

TINY = qwen3_06b.Qwen3Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                            intermediate=96, vocab=320, max_positions=256)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return qwen3_06b.generate(tmp_path_factory.mktemp("models"), shape=TINY, seed=7)


def test_stream_read_reports_every_pass_and_rejects_bad_flags() -> None:
    binary = build_c_program("stream_read", [BENCH_DIR / "c" / "stream_read.c"])
    out = subprocess.run([str(binary), "--mib", "8", "--threads", "2", "--passes", "3"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["bytes"] == 8 << 20 and doc["threads"] == 2 and len(doc["gbps"]) == 3
    assert doc["gbps_best"] == pytest.approx(max(doc["gbps"]), abs=1e-3)
    bad = subprocess.run([str(binary), "--passes", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--passes" in bad.stderr


def test_fma_peak_reports_every_pass_and_rejects_bad_flags() -> None:
    binary = build_c_program("fma_peak", [BENCH_DIR / "c" / "fma_peak.c"])
    doc = json.loads(subprocess.run([str(binary), "--passes", "2"], capture_output=True,
                                    text=True, check=True).stdout)
    assert doc["chains"] == 12 and len(doc["passes_gflops"]) == 2
    assert doc["best_gflops"] == pytest.approx(max(doc["passes_gflops"]), abs=0.01)
    assert doc["best_gflops"] > 1
    for bad in (["--passes", "0"], ["--passes", "x"], ["--mib", "8"]):
        proc = subprocess.run([str(binary), *bad], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("fma_peak: ")


@pytest.mark.parametrize("level, bits", [("v3", 256), ("v4", 512)])
def test_fma_peak_runs_at_each_levels_width(level: str, bits: int) -> None:
    lv = next(lv for lv in isa.LEVELS["x86_64"] if lv.name == level)
    if isa.missing(lv, isa.host_features()):
        pytest.fail(f"this host lacks {level} (the development machine has AVX-512)")
    binary = build_c_program("fma_peak", [BENCH_DIR / "c" / "fma_peak.c"], target=f"x86_64:{level}")
    doc = json.loads(subprocess.run([str(binary), "--passes", "1"], capture_output=True,
                                    text=True, check=True).stdout)
    assert doc["bits"] == bits and doc["lanes"] == bits // 32
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)], capture_output=True,
                          text=True, check=True).stdout
    register = "%zmm" if bits == 512 else "%ymm"
    assert re.search(rf"vfmadd\d+ps\s+{register}", code)
    assert (level == "v3") == ("%zmm" not in code)
    assert doc["dot_bf16_best_gflops"] is None and "vdpbf16ps" not in code


def test_fma_peak_measures_bf16_dot_products_at_v4_vnni() -> None:
    """At the level with AVX512_BF16 the peak has a second figure, vdpbf16ps's (two
    multiply-adds a lane an instruction; on the development machine's Zen 5, 1.8-1.9x the FMA
    peak, as bench/prefill.py prints: a test never asserts a speed, which a loaded machine
    changes). A host without the level checks the build only."""
    binary = build_c_program("fma_peak", [BENCH_DIR / "c" / "fma_peak.c"], target="x86_64:v4-vnni")
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)], capture_output=True,
                          text=True, check=True).stdout
    assert re.search(r"vdpbf16ps\s+%zmm", code)
    lv = next(lv for lv in isa.LEVELS["x86_64"] if lv.name == "v4-vnni")
    if not isa.missing(lv, isa.host_features()):
        doc = json.loads(subprocess.run([str(binary), "--passes", "1"], capture_output=True,
                                        text=True, check=True).stdout)
        assert doc["dot_bf16_best_gflops"] > 0 and doc["best_gflops"] > 0


def test_prefill_reports_each_engines_share_of_the_levels_peak(capsys) -> None:
    cell = prefill.Cell("f32", 1, lmc_cpu_s=[2.0, 2.0, 3.0], llama_cpu_s=[4.0, 5.0, 4.0])
    two_threads = prefill.Cell("f32", 2, lmc_cpu_s=[1.0], llama_cpu_s=[1.0])
    peak = prefill.FmaPeak("v4", "avx512f", 512, 100.0)
    shares = prefill.print_fractions([cell, two_threads], 100e9, peak, lmc_exact=True)
    # 100 G operations in the median 2 and 4 CPU seconds: 50 and 25 G per second of 100
    assert shares == [{"weights": "f32", "isa": "v4", "lmc": 0.5, "llama_bench": 0.25}]
    assert "512-bit avx512f" in capsys.readouterr().out
    # bf16 at a level with vdpbf16ps: also its share of the bf16 dot-product peak
    bf16 = prefill.Cell("bf16", 1, lmc_cpu_s=[1.0], llama_cpu_s=[2.0])
    peak = prefill.FmaPeak("v4-vnni", "avx512f", 512, 100.0, dot_bf16_gflops=200.0)
    shares = prefill.print_fractions([bf16], 100e9, peak, lmc_exact=True)
    assert shares == [{"weights": "bf16", "isa": "v4-vnni", "lmc": 1.0, "llama_bench": 0.5,
                       "dot_bf16_peak": 200.0, "lmc_of_dot_bf16": 0.5,
                       "llama_bench_of_dot_bf16": 0.25}]
    assert "bf16 dot-product peak (200.0, vdpbf16ps) | 50% | 25% | 32% |" in capsys.readouterr().out
    sparse = prefill.print_fractions([cell], 100e9, peak, lmc_exact=False)
    assert sparse[0]["lmc"] is None and sparse[0]["llama_bench"] == 0.25


def test_prefill_operations_count_every_product_of_the_model(
        tiny_models: dict[str, Path]) -> None:
    """prefill.prefill_ops against the model file: twice the weights of every layer matrix per
    token, the lm_head once, and causal attention's pairs counted one by one."""
    from safetensors.numpy import load_file

    model = tiny_models["F32"]
    tensors = load_file(model / "model.safetensors")
    layer_weights = sum(t.size for name, t in tensors.items()
                        if name.startswith("model.layers.") and t.ndim == 2)
    tokens = 37
    pairs = sum(query + 1 for query in range(tokens))
    want = (2 * layer_weights * tokens + 2 * TINY.vocab * TINY.hidden
            + TINY.layers * TINY.heads * pairs * TINY.head_dim * 4)
    assert prefill.prefill_ops(roofline.Shape.from_model_dir(model), tokens) == want


def fma_stream_sum(mib: int) -> float:
    """What one pass of ``stream_read --kernel fma`` must sum, by numpy: every f32 of the
    buffer's whole 16 KiB quads (4 rows of 1024, packed 8 columns per row in turn) times the
    activation of its column. The values are small multiples of powers of two, so the sum is
    exact in any order."""
    n = (mib << 20) // 16384 * 4096
    i = np.arange(n, dtype=np.int64)
    w = ((i % 2039) - 1019) / 1024.0
    p = i % 4096
    x = ((p // 32 * 8 + p % 8) % 13 + 1) / 16.0
    return float(np.dot(w, x))


def test_stream_read_fma_kernel_reads_every_quad_once() -> None:
    binary = build_c_program("stream_read", [BENCH_DIR / "c" / "stream_read.c"])
    for threads in (1, 3):
        out = subprocess.run([str(binary), "--mib", "3", "--threads", str(threads), "--passes",
                              "2", "--kernel", "fma"], capture_output=True, text=True, check=True)
        doc = json.loads(out.stdout)
        assert doc["kernel"] == "fma" and doc["bytes"] == 3 << 20
        assert doc["fma_checksum"] == 2 * fma_stream_sum(3)
    bad = subprocess.run([str(binary), "--kernel", "fmx"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'sum' or 'fma'" in bad.stderr


def test_stream_read_sums_the_same_on_aarch64_under_qemu() -> None:
    # qemu runs it for correctness only: its timings are emulation, not performance
    native = build_c_program("stream_read", [BENCH_DIR / "c" / "stream_read.c"])
    arm = build_c_program("stream_read", [BENCH_DIR / "c" / "stream_read.c"], target="aarch64")
    for kernel in ("sum", "fma"):
        args = ["--mib", "4", "--threads", "2", "--passes", "2", "--kernel", kernel]
        want = json.loads(subprocess.run([str(native), *args], capture_output=True, text=True,
                                         check=True).stdout)
        got = json.loads(subprocess.run(["qemu-aarch64-static", "-cpu", "cortex-a76", str(arm),
                                         *args], capture_output=True, text=True,
                                        check=True).stdout)
        assert got["bytes"] == want["bytes"]
        assert (got["checksum"], got["fma_checksum"]) == (want["checksum"], want["fma_checksum"])
    assert got["fma_checksum"] == 2 * fma_stream_sum(4)


def test_build_c_program_reuses_the_build(tmp_path: Path) -> None:
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    first = build_c_program("hello", [source], build_root=tmp_path / "b")
    mtime = first.stat().st_mtime_ns
    assert build_c_program("hello", [source], build_root=tmp_path / "b") == first
    assert first.stat().st_mtime_ns == mtime
    assert subprocess.run([str(first)], capture_output=True, text=True).stdout == "hi\n"


def test_f32_and_bf16_models_hold_the_same_values(tiny_models: dict[str, Path]) -> None:
    from safetensors.numpy import load_file

    f32 = load_file(tiny_models["F32"] / "model.safetensors")
    bf16 = gguf_convert.read_safetensors(tiny_models["BF16"] / "model.safetensors")
    names = [name for name, _, _ in qwen3_06b.tensor_specs(TINY)]
    assert sorted(f32) == sorted(names) and "lm_head.weight" not in f32
    for name in names:
        np.testing.assert_array_equal(f32[name], gguf_convert.as_float32(bf16[name]))
    std = float(f32["model.layers.1.mlp.up_proj.weight"].std())
    assert 0.015 < std < 0.025


def test_generation_is_deterministic_and_reused(tmp_path: Path,
                                                tiny_models: dict[str, Path]) -> None:
    again = qwen3_06b.generate(tmp_path, dtypes=("BF16",), shape=TINY, seed=7)["BF16"]
    original = tiny_models["BF16"] / "model.safetensors"
    assert (again / "model.safetensors").read_bytes() == original.read_bytes()
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    qwen3_06b.generate(tmp_path, dtypes=("BF16",), shape=TINY, seed=7)
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime


def test_transformers_loads_the_generated_model(tiny_models: dict[str, Path]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["BF16"],
                                                              dtype=torch.float32)
    assert model.config.tie_word_embeddings
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, TINY.vocab) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("gguf_type, tolerance", [("f32", 0.0), ("q8_0", 0.01), ("bf16", 0.0)])
def test_gguf_conversion_round_trips(tmp_path: Path, tiny_models: dict[str, Path],
                                     gguf_type: str, tolerance: float) -> None:
    gguf = pytest.importorskip("gguf")
    out = gguf_convert.convert(tiny_models["BF16"], tmp_path / "m.gguf", gguf_type)
    reader = gguf.GGUFReader(out)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(qwen3_06b.tensor_specs(TINY))
    assert reader.fields["qwen3.block_count"].contents() == TINY.layers
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == TINY.vocab
    source = gguf_convert.read_safetensors(tiny_models["BF16"] / "model.safetensors")
    for hf_name, gguf_name in [("model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight"),
                               ("model.norm.weight", "output_norm.weight")]:
        want = gguf_convert.as_float32(source[hf_name])
        got = gguf.quants.dequantize(tensors[gguf_name].data, tensors[gguf_name].tensor_type)
        scale = float(np.abs(want).max())
        assert np.abs(got.reshape(want.shape) - want).max() <= tolerance * scale


def test_unknown_tensor_names_are_refused() -> None:
    with pytest.raises(gguf_convert.ConvertError, match="model.layers.0.mlp.extra.weight"):
        gguf_convert.gguf_name("model.layers.0.mlp.extra.weight")


def test_weight_bytes_match_the_parameter_count(tiny_models: dict[str, Path]) -> None:
    shape = roofline.Shape.from_model_dir(tiny_models["F32"])
    # every parameter once (the tied embedding read as the lm_head) plus one embedding row
    assert roofline.weight_bytes_per_token(shape, "f32") == 4 * (
        qwen3_06b.parameter_count(TINY) + TINY.hidden)
    full = qwen3_06b.QWEN3_06B
    assert qwen3_06b.parameter_count(full) == 596_049_920
    assert roofline.kv_bytes_per_token(shape, "f32", 10) == 2 * 10 * 2 * 16 * 2 * 4


def test_lmc_generates_from_the_generated_model(lmc: Path, tiny_models: dict[str, Path]) -> None:
    prompt = roofline.bench_prompt(6, TINY.vocab)
    runs = [roofline.run_lmc_generate(lmc, tiny_models[d], prompt, 4, 2) for d in ("F32", "BF16")]
    assert len(runs[0]["tokens"]) == 4 and runs[0]["decode_ms_per_token"] > 0
    assert runs[0]["tokens"] == runs[1]["tokens"]  # same values in both files


def test_a_paired_run_splits_the_step_into_attention_and_the_rest(
        lmc: Path, tiny_models: dict[str, Path]) -> None:
    prompt = roofline.bench_prompt(24, TINY.vocab)
    doc = roofline.run_lmc_generate(lmc, tiny_models["F32"], prompt, 8, 1)
    shape = roofline.Shape.from_model_dir(tiny_models["F32"])
    # passes of the run's thread count (1) and of another (2, not a median for this run)
    ceiling = [roofline.Bandwidth(1, 1 << 30, 10.0, 9.0, [8.0, 10.0]),
               roofline.Bandwidth(2, 1 << 30, 30.0, 30.0, [30.0, 30.0])]
    run = roofline.paired_run(shape, "f32", "f32", 24, 8, doc, ceiling)
    steps = doc["steps"]
    assert run.stream_gbps == 30.0 and run.attn_ms == doc["attn_ms_per_token"]
    assert run.stream_median_gbps == 9.0
    assert run.stream_own_fraction == pytest.approx(9.0 / 30.0, abs=1e-3)
    assert run.fraction_of_median == pytest.approx(run.fraction * 30.0 / 9.0, abs=3e-3)  # rounding
    # the rest of a step is a step less its attention: never longer than the longest step
    assert 0 < run.weights_ms <= max(s["ms"] for s in steps)
    assert min(s["ms"] - s["attn_ms"] for s in steps) <= run.weights_ms
    weights = roofline.weight_bytes_per_token(shape, "f32")
    assert run.weights_fraction == pytest.approx(weights / (run.weights_ms / 1e3) / 1e9 / 30.0,
                                                 abs=1e-3)


def test_weight_stream_takes_its_ratios_within_each_round() -> None:
    # STREAM swings 40 -> 100 GB/s between rounds; lmc does not follow it
    rounds = [weight_stream.Round("f32", 2, stream, fma, lmc, lmc * 0.95)
              for stream, fma, lmc in ((40.0, 40.0, 38.0), (100.0, 80.0, 50.0),
                                       (60.0, 60.0, 54.0))]
    summary = weight_stream.summarise(rounds)
    assert summary.lmc_of_stream == [0.9, 0.5, 0.95]  # ratios 0.95, 0.5, 0.9: not 50 / 60
    assert summary.lmc_of_fma == [0.9, 0.625, 0.95]
    assert summary.fma_of_stream == [1.0, 0.8, 1.0]
    assert (summary.stream_gbps, summary.lmc_weights_gbps, summary.rounds) == (60.0, 50.0, 3)
    with pytest.raises(ValueError, match="one configuration"):
        weight_stream.summarise([*rounds, weight_stream.Round("f32", 1, 40, 40, 38, 36)])


@pytest.mark.parametrize("script, args", [("weight_stream.py", ["--threads", "1", "0"]),
                                          ("weight_stream.py", ["--rounds", "x"]),
                                          ("roofline.py", ["--repeats", "-1"])])
def test_benches_refuse_counts_below_one(script: str, args: list[str]) -> None:
    proc = subprocess.run([sys.executable, str(BENCH_DIR / script), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "expected a whole number >= 1" in proc.stderr and proc.stdout == ""


def test_vs_llamacpp_refuses_a_spec_without_both_engines(tmp_path: Path, capsys) -> None:
    # before Ray starts or anything is stored: exit 2 naming the file and the key
    spec = BENCH_DIR.parent / "specs" / "demo.toml"
    assert vs_llamacpp.main(["--spec", str(spec), "--db", f"sqlite:///{tmp_path}/x.db"]) == 2
    assert f"{spec}: key 'engines' must name both" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()


def test_depth_bench_pairs_lmc_and_llama_bench_per_round(llama_bench: Path, tmp_path: Path,
                                                          tiny_models: dict[str, Path]) -> None:
    """bench/depth4096.py end to end on the tiny model: llama-bench's tg at depth and lmc's
    exact and sparse decode after the same depth, a ratio per round from the same round."""
    out = tmp_path / "depth.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "depth4096.py"), "--model", str(tiny_models["BF16"]),
         "--depth", "96", "--decode", "4", "--rounds", "2", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    series = {s["name"]: s["tokens_per_s"] for s in json.loads(out.read_text())["series"]}
    assert set(series) == {"llama.cpp", "lmc exact", "lmc sparse"}
    assert all(len(v) == 2 and min(v) > 0 for v in series.values())
    lines = {line.split("|")[0].strip(): line for line in proc.stdout.splitlines() if "|" in line}
    ratio = series["lmc exact"][0] / series["llama.cpp"][0]
    ratios = sorted([ratio, series["lmc exact"][1] / series["llama.cpp"][1]])
    assert f"[{ratios[0]:.3f}, {ratios[1]:.3f}]" in lines["lmc exact"]


def test_prefill_bench_pairs_lmc_and_llama_bench_per_round(llama_bench: Path, tmp_path: Path,
                                                            tiny_models: dict[str, Path]) -> None:
    """bench/prefill.py end to end on the tiny model: llama-bench's pp and lmc's prefill of the
    same prompt, per round, with the user CPU seconds of each (baseline subtracted)."""
    out = tmp_path / "prefill.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "prefill.py"), "--model", str(tiny_models["BF16"]),
         "--prompt", "64", "--types", "f32", "--threads", "1", "--rounds", "2",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (cell,) = json.loads(out.read_text())["cells"]
    assert (cell["gguf_type"], cell["threads"]) == ("f32", 1)
    assert len(cell["lmc_ms"]) == len(cell["llama_ms"]) == len(cell["lmc_cpu_s"]) == 2
    assert min(cell["lmc_ms"] + cell["llama_ms"]) > 0
    ratios = sorted(b / a for a, b in zip(cell["lmc_ms"], cell["llama_ms"], strict=True))
    assert f"[{ratios[0]:.3f}, {ratios[1]:.3f}]" in proc.stdout
    # one thread: how close each engine runs to this host's FMA peak (on this tiny model the
    # CPU seconds left after the baseline may be noise: a figure or a dash, never a failure)
    fractions = proc.stdout.split("this host's FMA peak at v3 (256-bit avx2+fma):")[1]
    assert re.search(r"^\| f32 \| (\d+\.\d \(\d+%\)|– \(within the baseline's noise\)) \| ",
                     fractions, re.MULTILINE), fractions
    doc = json.loads(out.read_text())
    assert doc["fma_peak"]["isa"] == "v3" and doc["fma_peak"]["bits"] == 256
    assert [share["weights"] for share in doc["peak_shares"]] == ["f32"]


def test_sparse_prefill_bench_times_each_config_against_exact(
        tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    out = tmp_path / "sparse.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "sparse_prefill.py"), "--model",
         str(tiny_models["BF16"]), "--prompt", "96", "--wq", "f32", "--rounds", "2",
         "--config", "--attn sparse --prefill-attn sparse --k 2 --block 8", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["exact", "--attn sparse --prefill-attn sparse --k 2 --block 8"]
    assert all(len(r["ms"]) == len(r["cpu_s"]) == 2 and min(r["ms"]) > 0 for r in runs.values())
    assert "| exact | " in proc.stdout and "1.000 [1.000, 1.000]" in proc.stdout


def test_kv_memory_bench_sets_budgets_against_exact(tmp_path: Path,
                                                    tiny_models: dict[str, Path]) -> None:
    out = tmp_path / "kv.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "kv_memory.py"), "--model", str(tiny_models["BF16"]),
         "--ctx", "128", "--max-new", "2", "--block", "8", "--budgets", "0.25", "--threads", "1",
         "--wq", "f32", "--rounds", "2", "--json", str(out)], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert {name: len(ms) for name, ms in doc["prefill_ms"].items()} == {"exact": 2,
                                                                         "window 25%": 2}
    assert "| exact | " in proc.stdout and "1.000 [1.000, 1.000]" in proc.stdout
    exact, budget = runs["exact"]["kv_memory"], runs["window 25%"]["kv_memory"]
    assert not exact["paged"] and budget["paged"]
    # 2 layers x 2 KV heads, 16 blocks each; a budget of 32 positions keeps 4 blocks per head,
    # and a new block is written (one per KV head of one layer) before the query evicts
    block = budget["block_bytes"]
    assert exact["peak_live_bytes"] == 4 * 16 * block
    assert budget["peak_live_bytes"] == (4 * 4 + 2) * block
    assert "| window 25% |" in proc.stdout


@pytest.mark.parametrize("k, summary", [(32, False), (32, True), (2, False)])
def test_attention_bench_counts_the_bytes_a_grouped_step_reads(lmc: Path, tmp_path: Path,
                                                               k: int, summary: bool) -> None:
    # 2 query heads on 1 KV head, 10 full blocks of 32 positions, rows of 16 f32
    trace = tmp_path / "trace.txt"
    subprocess.run([str(lmc), "attn-bench", "--ctx", "320", "--heads", "2", "--kv-heads", "1",
                    "--head-dim", "16", "--attn", "sparse", "--k", str(k), "--no-importance",
                    "--runs", "1", "--trace-selection", str(trace),
                    *(["--probe-summary"] if summary else [])], check=True, capture_output=True)
    picks = [set(map(int, line.split()[4:])) for line in trace.read_text().splitlines()
             if not line.startswith("#")]
    assert len(picks) == 2
    union = picks[0] | picks[1]  # a block both heads chose is read once
    probes = 10 * 2 if summary else 10 * 8  # centroids per head, or 8 probe keys per block once
    want = (probes + 2 * 32 * len(union)) / (2 * 320)
    args = argparse.Namespace(heads=2, kv_heads=1, head_dim=16, kv="f32")
    assert attention.bytes_fraction(trace, 320, args, summary) == pytest.approx(want)
    if k == 32:
        assert union == set(range(10))
    else:
        assert len(union) in (2, 3) and 9 in union  # the recency block, and each head's top probe


def _seed_store(path: Path) -> None:
    """A seed store of three runs in lmc/1's shape (generate on a needle and a decode
    workload, attn-bench), as bench/scale.py reads real ones."""
    from db import Outcome, RunResult, Snapshot, Store, timings_from_steps

    store = Store.open(f"sqlite:///{path}")
    try:
        exp = store.upsert_experiment("seed", "name = 'seed'", "0")
        dev = store.upsert_device("local", "x86_64", "local", False, {"address": "local"})
        model = store.upsert_model("/models/needle-tiny", "ab" * 32, {"hidden_size": 128})
        fingerprint = {"arch": "x86_64", "schema": "benchfarm.fingerprint/3", "cores": []}
        for n, (kind, command, params) in enumerate([
                ("needle", "generate", {"ctx": 512, "depth": 0.5, "seed": 1}),
                ("decode", "generate", {"ctx": 256, "seed": 0}),
                ("attn-bench", "attn-bench", {"ctx": 2048, "heads": 8})]):
            workload = store.upsert_workload(kind, params, f"{n:064x}", [1, 2, 3],
                                             answer="42" if kind == "needle" else None)
            steps = [{"token": 10 + i, "ms": 0.06 + i * 1e-3, "attn_ms": 0.03} for i in range(5)]
            doc = ({"schema": "lmc/1", "command": command, "config": {"threads": 1},
                    "prompt_tokens": 512, "prefill_ms": 31.5, "tokens": [s["token"] for s in steps],
                    "steps": steps, "decode_ms_per_token": 0.062, "attn_ms_per_token": 0.03}
                   if command == "generate" else
                   {"schema": "lmc/1", "command": command, "ms": 0.115, "runs": [0.115, 0.1]})
            store.save_run(RunResult(
                run_key=f"seed-{n}", experiment_id=exp, device_id=dev, command=command,
                model_id=model if command == "generate" else None, workload_id=workload,
                config={"policy": "exact", "threads": 1, "argv_options": ["--threads", "1"]},
                policy="exact", threads=1, exit_code=0, wall_ms=50.0, engine_ms=40.0,
                overhead_ms=10.0, raw_json=json.dumps(doc),
                prefill_ms=doc.get("prefill_ms"),
                decode_ms_per_token=doc.get("decode_ms_per_token"),
                attn_ms_per_token=doc.get("attn_ms_per_token"),
                token_timings=timings_from_steps(doc.get("steps", [])),
                outcome=Outcome(recall=1.0) if kind == "needle" else Outcome(attn_median_ms=0.115),
                snapshots=[Snapshot("before", fingerprint), Snapshot("after", fingerprint)]))
    finally:
        store.close()


def test_scale_grows_a_store_of_the_asked_size_with_its_planted_steps(tmp_path: Path) -> None:
    """bench/scale.py's growth: exactly the measurements asked, exp-1k and the nightly of the
    plan's sizes, and the planted steps recorded and present in the nightly's timings; the same
    seed grows the same runs."""
    from db import Store

    _seed_store(tmp_path / "seed.db")
    templates = scale_grow.load_templates([tmp_path / "seed.db"])
    assert sorted(t.kind for t in templates) == ["attn-bench", "decode", "needle"]
    plan = scale_grow.Plan(measurements=200, experiments=4, revisions=6, configs=2,
                           exp_runs=20, boards=8)
    listed = []
    for name in ("a", "b"):
        store = Store.open(f"sqlite:///{tmp_path / name}.db")
        try:
            manifest = scale_grow.grow(store, templates, plan, seed=3)
            listed.append([(r.run_key, r.experiment, r.device, r.status, r.decode_ms_per_token,
                            r.measurements) for r in store.list_runs()])
        finally:
            store.close()
    assert listed[0] == listed[1]  # reproducible
    runs = listed[0]
    assert sum(r[5] for r in runs) == manifest.counts["measurements"] == 200
    assert len(runs) == manifest.counts["runs"]
    per_experiment = {name: sum(1 for r in runs if r[1] == name) for name in {r[1] for r in runs}}
    assert len(per_experiment) == 4 and per_experiment["exp-1k"] == 20
    assert per_experiment["nightly"] == 6 * 2
    assert {r[2] for r in runs if r[1] == "exp-1k"} == set(manifest.compare_boards)
    assert manifest.planted and manifest.sample_run and manifest.sample_job
    assert len(manifest.revisions) == 6 and manifest.revisions == sorted(manifest.revisions)
    # every planted step is where the manifest says: the nightly's decode timing of its
    # series changes by its factor from its revision on (2 % noise per run)
    nightly = {key: decode for key, experiment, _, status, decode, _ in runs
               if experiment == "nightly" and status == "ok"}
    for plant in manifest.planted:
        assert plant["revision"] == manifest.revisions[plant["revision_index"]]
        at, series = plant["revision_index"], plant["series"]
        after = nightly.get(scale_grow.run_key(3, "nightly", at * 2 + series))
        before = nightly.get(scale_grow.run_key(3, "nightly", (at - 1) * 2 + series))
        if after and before:
            others = [p["factor"] for p in manifest.planted
                      if p["series"] == series and p["revision_index"] == at and p is not plant]
            assert not others
            assert after / before == pytest.approx(plant["factor"], rel=0.1)
