"""The engines the harness can run, each behind one small adapter (see ``base.Engine``).

To add an engine: write ``harness/engines/<name>.py`` with a class providing ``build``,
``argv``, ``parse``, ``measurements``, ``health_argv`` and ``health_verdict`` (and, if its
options differ from lmc's, a config record and the parse of its own spec section), register it
in ``ENGINES``, and teach ``harness.matrix.expand`` which workload kinds it runs. README.md has
the checklist.
"""

from __future__ import annotations

from pathlib import Path

from devices.health import EngineCheck
from harness.engines.base import Engine
from harness.engines.llamabench import LlamaBenchEngine
from harness.engines.lmc import NAME as LMC
from harness.engines.lmc import LmcEngine
from harness.errors import InputError

ENGINES: dict[str, Engine] = {LMC: LmcEngine(), "llama-bench": LlamaBenchEngine()}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(f"unknown engine {name!r}; allowed: {', '.join(ENGINES)}") from None


def engine_check(name: str, binary: Path | None, problem: str | None = None) -> EngineCheck:
    """The device health check of engine ``name`` (``devices check``), from its adapter."""
    engine = get_engine(name)
    return EngineCheck(name=" ".join([name, *engine.health_argv("")[1:]]), binary=binary,
                       problem=problem, argv=engine.health_argv, verdict=engine.health_verdict)
