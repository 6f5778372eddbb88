"""llama.cpp fixtures: llama-bench built for x86_64 and aarch64, and the shipped needle model
converted to GGUF in the session.

The builds are cached outside the work tree (``~/.cache/benchfarm/llama-cpp/<target>-<key>``,
keyed by source, target, compiler and flags; `harness/engines/llamabench/build.py`), the
same cache `benchfarm build --engine llama-bench` fills: a fresh machine builds them on its
first test run (about 15 minutes on two idle cores, within CI's limit), later runs reuse them.
The tests never skip for want of a build."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines.llamabench import LlamaBenchAdapter
from harness.engines.llamabench.build import build_llama_bench


@pytest.fixture(scope="session")
def llama_bench() -> Path:
    return Path(build_llama_bench("x86_64:v3").binary)


@pytest.fixture(scope="session")
def llama_bench_aarch64() -> Path:
    return Path(build_llama_bench("aarch64:armv8.2-a+dotprod").binary)


@pytest.fixture(scope="session")
def needle_gguf(needle_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """needle-tiny as an f32 GGUF, converted in this session."""
    adapter = LlamaBenchAdapter(gguf_dir=tmp_path_factory.mktemp("gguf"))
    return adapter.artifact(needle_model, "f32").path
