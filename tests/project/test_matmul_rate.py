"""bench/c/matmul_rate.c: lmc's weight products alone, as bench/prefill.py sets them beside a
whole prefill. The program links the engine's own matmul.c, so what is checked here is that it
runs every layer's products (the operations and bytes it claims, the layers it says it reads)
and that prefill.py's table divides the right figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import prefill  # noqa: E402
import roofline  # noqa: E402

# every matrix's columns a multiple of 32, so q8 rows have no padding: 1 + 2/32 bytes a value
SHAPE = roofline.Shape(hidden=64, intermediate=96, layers=3, heads=4, kv_heads=2, head_dim=16,
                       vocab=256)
BYTES_PER_VALUE = {"f32": 4.0, "bf16": 2.0, "q8": 1.0 + 2.0 / 32}


@pytest.fixture(scope="module")
def binary() -> Path:
    return prefill.matmul_rate_binary("v3")


@pytest.mark.parametrize("wq", ["f32", "bf16", "q8"])
def test_matmul_rate_runs_every_layers_products_and_reads_its_weights(binary: Path,
                                                                     wq: str) -> None:
    streamed = prefill.matmul_rate(binary, SHAPE, wq, "--tokens", "8", "--passes", "2")
    assert streamed["operations"] == 2 * 8 * SHAPE.layer_values
    assert streamed["weight_bytes"] == pytest.approx(BYTES_PER_VALUE[wq] * SHAPE.layer_values)
    rates = [p["gflops_per_cpu_s"] for p in streamed["passes"]]
    assert len(rates) == 2 and streamed["best_gflops_per_cpu_s"] == pytest.approx(max(rates))
    # --cached: layer 0's weights three times, so a third of the bytes and the same operations
    cached = prefill.matmul_rate(binary, SHAPE, wq, "--tokens", "8", "--passes", "1", "--cached")
    assert cached["operations"] == streamed["operations"]
    assert cached["weight_bytes"] == pytest.approx(streamed["weight_bytes"] / SHAPE.layers)
    # the checksum adds one output of each layer's last product: layer 0's, three times
    one = prefill.matmul_rate(binary, roofline.Shape(**{**vars(SHAPE), "layers": 1}), wq,
                              "--tokens", "8", "--passes", "1")
    assert cached["checksum"] == pytest.approx(3 * one["checksum"], rel=1e-5)
    assert streamed["checksum"] != pytest.approx(3 * one["checksum"], rel=1e-3)
    # the engine's products give the same bits on any number of threads
    two = prefill.matmul_rate(binary, SHAPE, wq, "--tokens", "8", "--passes", "1",
                              "--threads", "2")
    assert two["checksum"] == streamed["checksum"]


def test_matmul_rate_refuses_bad_options(binary: Path) -> None:
    for bad in (["--wq", "f16"], ["--layers", "0"], ["--tokens", "x"], ["--mib", "8"],
                ["--passes"]):
        proc = subprocess.run([str(binary), *bad], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("matmul_rate: "), bad


def test_prefill_sets_the_weight_products_beside_the_whole_prefill(capsys) -> None:
    # 100 G operations in a median 2 CPU seconds (lmc) and 2.6 (llama-bench), a peak of 100
    cell = prefill.Cell("f32", 1, lmc_cpu_s=[2.0, 2.0, 3.0], llama_cpu_s=[2.6, 2.6, 2.0])
    two_threads = prefill.Cell("q8_0", 2, lmc_cpu_s=[1.0], llama_cpu_s=[1.0])
    peak = prefill.FmaPeak("v4", "avx512f", 512, 100.0)
    products = [prefill.WeightProducts("f32", streamed=60.0, cached=72.0),
                prefill.WeightProducts("q8", streamed=10.0, cached=10.0)]
    shares = prefill.print_fractions([cell, two_threads], 100e9, peak, lmc_exact=True)
    capsys.readouterr()  # the shares' own table
    prefill.print_weight_products(shares, products, peak)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| f32")]
    # the products' shares, the whole prefill's (50 of 100), what 1.3x llama-bench needs (50)
    assert rows == ["| f32 | 60.0 (60%) | 72.0 (72%) | 50% | 50% |"]
    assert "| q8_0" not in out  # a two-thread cell has no share of the one-thread peak
