"""The engines the harness can run, each behind one adapter (see ``base.EngineAdapter``), in a
package of its own: ``lmc`` (this project's engine) and ``llamabench`` (llama.cpp's
llama-bench).

To add an engine: write ``harness/engines/<name>/`` with an adapter providing the methods of
``base.EngineAdapter`` (its spec section and config records, the kinds it runs, its builds and model
artifacts, its work orders, argv, the check of its output, its figures and outcome, a
health command) and register it in ``ENGINES``. README.md has the checklist.
"""

from __future__ import annotations

from pathlib import Path

from devices.health import HealthCommand
from harness.engines.base import EngineAdapter
from harness.engines.llamabench import LlamaBenchAdapter
from harness.engines.lmc import LmcAdapter
from harness.engines.lmc.build import build_c_program
from harness.errors import InputError

# The order is the order of a matrix's cells (and the first one is a spec's default engine).
ENGINES: dict[str, EngineAdapter] = {adapter.name: adapter
                                     for adapter in (LmcAdapter(), LlamaBenchAdapter())}
# The farm's own engine: a spec's when it names none, and the one a board's health check runs.
DEFAULT_ENGINE = next(iter(ENGINES))


def adapter_of(name: str) -> EngineAdapter:
    """The adapter of the engine named ``name``; InputError for an engine not in ENGINES."""
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(f"unknown engine {name!r}; allowed: {', '.join(ENGINES)}") from None


def health_command(name: str, binary: Path | None,
                   problem: str | None = None) -> HealthCommand:
    """The device health check of engine ``name`` (``devices check``), from its adapter."""
    adapter = adapter_of(name)
    return HealthCommand(name=" ".join([name, *adapter.health_argv("")[1:]]), binary=binary,
                         problem=problem, argv=adapter.health_argv,
                         verdict=adapter.health_verdict)


def build_program(name: str, sources: list[Path], target: str) -> Path:
    """A stand-alone C program (a bench kernel, a board's limit probe) built for ``target``
    with the toolchains and release flags the engines are built with; its path."""
    return build_c_program(name, sources, target)


def source_paths(engines: list[str]) -> list[str]:
    """The folders of this repository that ``engines`` are built from: a spec's revisions are
    commits, and history follows those that change these folders."""
    return list(dict.fromkeys(path for name in engines for path in adapter_of(name).source_paths))
