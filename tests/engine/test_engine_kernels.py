"""Engine parts checked below the model level, in C, built with the engine's release flags for
this machine (on x86_64 that is the AVX2 path): the q8 quantiser (weights, activations, KV
cache) against its rule written out, the attention's softmax pieces against libm and their
definitions, the prefill tile's probabilities (kept and recomputed) against the plain
reference, attention's row products (scores, value sums) against their rule at every x86
level this machine runs, and the thread pool against what pool_run promises. The softmax,
tile and row checks also run built for aarch64 under qemu (the NEON paths)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_engine import QEMU_AARCH64

from devices import isa
from harness.engines.base import parse_target
from harness.engines.lmc.build import find_toolchain, flags_for, host_arch

REPO = Path(__file__).resolve().parents[2]
TILE_SOURCES = ["attn_kernel.c", "kvcache.c", "matmul.c", "acts.c", "rows.c", "ops.c", "util.c",
                "threads.c", "safetensors.c", "json.c"]


def run_check(tmp_path: Path, check: str, engine_sources: list[str],
              target: str | None = None) -> str:
    """Build tests/engine/c/<check>.c with the engine's sources named (for ``target``, ``arch``
    or ``arch:level``, default this machine at its highest level; aarch64 runs under qemu), run
    it, return its output."""
    arch, level = parse_target(target)
    toolchain = find_toolchain(arch)
    cflags, ldflags = flags_for(toolchain, "release", level)
    binary = tmp_path / f"{check}-{toolchain.target}"
    engine = REPO / "engine"
    subprocess.run([*toolchain.cc, *cflags, "-I", str(engine),
                    str(REPO / "tests" / "engine" / "c" / f"{check}.c"),
                    *(str(engine / source) for source in engine_sources),
                    "-o", str(binary), *ldflags], check=True)
    emulated = toolchain.target == "aarch64" and host_arch() != "aarch64"
    proc = subprocess.run([*(QEMU_AARCH64 if emulated else []), str(binary)],
                          capture_output=True, text=True, timeout=300)
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
    out = run_check(tmp_path, "check_tile_importance", TILE_SOURCES)
    assert "174 positions: importance kept = recomputed, bit for bit" in out


ROWS_CHECKED = "sums checked: widths 0-150, 0-9 rows, 1-7 vectors agree bit for bit"


@pytest.mark.parametrize("level", [lv.name for lv in isa.LEVELS["x86_64"]
                                   if host_arch() == "x86_64"
                                   and not isa.missing(lv, isa.host_features())])
def test_attention_row_products_follow_their_rule_at_every_x86_level_here(
        tmp_path: Path, level: str) -> None:
    """dot_rows_f32_x and axpy_rows_f32_x (v4: the key rows two to a 512-bit register, the
    value sums 16 columns a vector and a masked last one) give their rule's bits at every
    width and row count."""
    assert ROWS_CHECKED in run_check(tmp_path, "check_rows", TILE_SOURCES, f"x86_64:{level}")


def test_softmax_and_tiles_hold_on_aarch64_under_qemu(tmp_path: Path) -> None:
    """The NEON paths (exponentials lane by lane, v8_reduce4, the tiles) against the same
    definitions; qemu runs them for correctness only."""
    if not shutil.which(QEMU_AARCH64[0]):
        pytest.skip("qemu-aarch64-static is not installed (scripts/setup.sh installs it)")
    assert "lengths 0-70 agree" in run_check(tmp_path, "check_softmax", ["ops.c", "util.c"],
                                             "aarch64")
    assert "importance kept = recomputed, bit for bit" in run_check(
        tmp_path, "check_tile_importance", TILE_SOURCES, "aarch64")
    assert ROWS_CHECKED in run_check(tmp_path, "check_rows", TILE_SOURCES, "aarch64")


def test_pool_runs_each_item_once_in_shares_and_steals_from_a_stalled_thread(
        tmp_path: Path) -> None:
    out = run_check(tmp_path, "check_pool", ["threads.c", "util.c"])
    assert "every item once for 1-4 threads; 304 two-thread traces in order" in out
