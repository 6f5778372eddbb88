"""Fixtures that build the real engine once per test session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.build import BuildRecord, build_engine


@pytest.fixture(scope="session")
def engine_build() -> BuildRecord:
    """The x86_64 release build of lmc."""
    return build_engine(target="x86_64")


@pytest.fixture(scope="session")
def lmc(engine_build: BuildRecord) -> Path:
    return Path(engine_build.binary)


@pytest.fixture(scope="session")
def engine_build_aarch64() -> BuildRecord:
    return build_engine(target="aarch64")


@pytest.fixture(scope="session")
def lmc_asan() -> Path:
    """lmc built with AddressSanitizer + UndefinedBehaviorSanitizer."""
    return Path(build_engine(target="x86_64", variant="asan").binary)


QEMU_AARCH64 = ["qemu-aarch64-static", "-cpu", "cortex-a76"]


def run_lmc(binary: Path | list[str], *args: str, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [str(binary)] if isinstance(binary, (str, Path)) else list(binary)
    return subprocess.run([*argv, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)
