"""llama.cpp fixtures: llama-bench built for x86_64 and aarch64 (cached under build/llama-cpp,
minutes the first time), and the shipped needle model converted to GGUF in the session.

The llama.cpp build is opt-in like PostgreSQL: BENCHFARM_TEST_LLAMACPP=1 (scripts/test.sh sets
it once both targets are built and cached). Without it the tests that need llama-bench are
skipped, saying so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.engines.llamabench import LlamaBenchEngine
from harness.engines.llamabench.build import build_llama_bench

LLAMA_OPT_IN = "BENCHFARM_TEST_LLAMACPP"


def llama_build(target: str) -> Path:
    if os.environ.get(LLAMA_OPT_IN) != "1":
        pytest.skip(f"llama.cpp tests are opt-in: set {LLAMA_OPT_IN}=1 (builds llama-bench "
                    "once into build/llama-cpp; scripts/test.sh does when both targets are cached)")
    return Path(build_llama_bench(target).binary)


@pytest.fixture(scope="session")
def llama_bench() -> Path:
    return llama_build("x86_64")


@pytest.fixture(scope="session")
def llama_bench_aarch64() -> Path:
    return llama_build("aarch64")


@pytest.fixture(scope="session")
def needle_gguf(needle_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """needle-tiny as an f32 GGUF, converted in this session."""
    engine = LlamaBenchEngine(gguf_dir=tmp_path_factory.mktemp("gguf"))
    return engine.artifact(needle_model, "f32").path
