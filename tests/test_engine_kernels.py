"""Engine parts checked below the model level, in C, built with the engine's release flags for
this machine (on x86_64 that is the AVX2 path): the q8 quantiser (weights, activations, KV
cache) against its rule written out, the attention's softmax pieces against libm and their
definitions, the prefill tile's probabilities (kept and recomputed) against the plain
reference, and the thread pool against what pool_run promises."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.engines.lmc.build import find_toolchain, flags_for, host_arch

REPO = Path(__file__).resolve().parent.parent


def run_check(tmp_path: Path, check: str, engine_sources: list[str]) -> str:
    """Build tests/c/<check>.c with the engine's sources named, run it, return its output."""
    toolchain = find_toolchain(host_arch())
    cflags, ldflags = flags_for(toolchain, "release")
    binary = tmp_path / check
    engine = REPO / "engine"
    subprocess.run([*toolchain.cc, *cflags, "-I", str(engine),
                    str(REPO / "tests" / "c" / f"{check}.c"),
                    *(str(engine / source) for source in engine_sources),
                    "-o", str(binary), *ldflags], check=True)
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_q8_quantiser_matches_its_rule(tmp_path: Path) -> None:
    out = run_check(tmp_path, "check_quantize", ["ops.c", "util.c"])
    assert "30000 rows, 0 mismatches" in out


def test_softmax_exp_is_within_2_ulp_of_libm_and_its_vectors_match_the_definition(
        tmp_path: Path) -> None:
    out = run_check(tmp_path, "check_softmax", ["ops.c", "util.c"])
    assert "values within" in out and "lengths 0-70 agree" in out
    words = out.split()
    checked, ulps = int(words[1]), int(words[4])
    assert checked > 1_700_000 and ulps <= 2


def test_prefill_tile_importance_recomputed_is_kept_bit_for_bit_and_the_references(
        tmp_path: Path) -> None:
    out = run_check(tmp_path, "check_tile_importance",
                    ["attn_kernel.c", "kvcache.c", "matmul.c", "ops.c", "util.c", "threads.c",
                     "safetensors.c", "json.c"])
    assert "174 positions: importance kept = recomputed, bit for bit" in out


def test_pool_runs_each_item_once_in_shares_and_steals_from_a_stalled_thread(
        tmp_path: Path) -> None:
    out = run_check(tmp_path, "check_pool", ["threads.c", "util.c"])
    assert "every item once for 1-4 threads; 304 two-thread traces in order" in out
