"""Engine kernels checked below the model level: the q8 quantiser (weights, activations, KV
cache) against its rule written out in C, built with the engine's release flags for this
machine (on x86_64 that is the AVX2 path)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.build import find_toolchain, flags_for, host_arch

REPO = Path(__file__).resolve().parent.parent


def test_q8_quantiser_matches_its_rule(tmp_path: Path) -> None:
    toolchain = find_toolchain(host_arch())
    cflags, ldflags = flags_for(toolchain, "release")
    binary = tmp_path / "check_quantize"
    engine = REPO / "engine"
    subprocess.run([*toolchain.cc, *cflags, "-I", str(engine),
                    str(REPO / "tests" / "c" / "check_quantize.c"), str(engine / "ops.c"),
                    str(engine / "util.c"), "-o", str(binary), *ldflags], check=True)
    proc = subprocess.run([str(binary)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "30000 rows, 0 mismatches" in proc.stdout
