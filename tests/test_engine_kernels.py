"""Engine kernels checked below the model level: the vector activation quantiser of the q8
path against the scalar rule it replaces, compiled with the engine's x86_64 release flags."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.build import find_toolchain, flags_for, host_arch

REPO = Path(__file__).resolve().parent.parent


def test_vector_quantiser_matches_the_scalar_rule(tmp_path: Path) -> None:
    if host_arch() != "x86_64":
        pytest.skip("the vector quantiser is the AVX2 path; other targets use the scalar rule")
    toolchain = find_toolchain("x86_64")
    cflags, ldflags = flags_for(toolchain, "release")
    binary = tmp_path / "check_quantize"
    subprocess.run([*toolchain.cc, *cflags, "-I", str(REPO / "engine"),
                    str(REPO / "tests" / "c" / "check_quantize.c"), "-o", str(binary),
                    *ldflags], check=True)
    proc = subprocess.run([str(binary)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "100000 blocks, 0 mismatches" in proc.stdout
