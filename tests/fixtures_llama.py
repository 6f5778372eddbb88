"""llama.cpp fixtures: llama-bench built for x86_64 and aarch64, and the shipped needle model
converted to GGUF in the session.

The builds are cached outside the work tree (``~/.cache/benchfarm/llama-cpp/<target>-<key>``,
keyed by source, target, compiler and flags; `harness/engines/llamabench/build.py`), the
same cache `benchfarm build --engine llama-bench` fills: later runs reuse them. On a cold
machine the session pays them once: as soon as the tests are collected, both targets start
building side by side in the background (at the lowest CPU priority, so the tests around them
keep their pace), and the modules that need a build run last. A fixture
waits for its build. The tests never skip for want of a build."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.engines.base import BuildRecord
from harness.engines.llamabench import LlamaBenchAdapter
from harness.engines.llamabench.build import build_llama_bench

# fixture name -> the target it builds
TARGETS = {"llama_bench": "x86_64:v3", "llama_bench_aarch64": "aarch64:armv8.2-a+dotprod"}
BACKGROUND_NICENESS = 19
_builds: dict[str, Future[BuildRecord]] = {}


def _needed(item: pytest.Item) -> set[str]:
    """The llama-bench fixtures an item uses, by name or through a parameter naming one
    (`request.getfixturevalue(build)`)."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {value for value in callspec.params.values() if isinstance(value, str)}
    return names & TARGETS.keys()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test that needs a build run after all others, in their order (whole
    modules, so that module fixtures are set up once)."""
    late = {item.module for item in items if _needed(item) and getattr(item, "module", None)}
    items[:] = ([item for item in items if getattr(item, "module", None) not in late]
                + [item for item in items if getattr(item, "module", None) in late])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the builds the collected tests need, both at once."""
    targets = sorted({TARGETS[name] for item in session.items for name in _needed(item)})
    if not targets:
        return
    pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="llama-build")
    for target in targets:
        _builds[target] = pool.submit(build_llama_bench, target,
                                      niceness=BACKGROUND_NICENESS)
    pool.shutdown(wait=False)


def _built(target: str) -> Path:
    started = _builds.get(target)  # a session that collected it started it
    record = started.result() if started else build_llama_bench(target)
    return Path(record.binary)


@pytest.fixture(scope="session")
def llama_bench() -> Path:
    return _built(TARGETS["llama_bench"])


@pytest.fixture(scope="session")
def llama_bench_aarch64() -> Path:
    return _built(TARGETS["llama_bench_aarch64"])


@pytest.fixture(scope="session")
def needle_gguf(needle_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """needle-tiny as an f32 GGUF, converted in this session."""
    adapter = LlamaBenchAdapter(gguf_dir=tmp_path_factory.mktemp("gguf"))
    return adapter.artifact(needle_model, "f32").path
