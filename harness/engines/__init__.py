"""The engines the harness can run, each behind one small adapter (see ``base.Engine``).

To add an engine: write ``harness/engines/<name>.py`` with a class providing ``build``,
``argv``, ``parse``, ``measurements`` and ``health_argv`` (and, if its options differ from
lmc's, a config record and the parse of its own spec section), register it in ``ENGINES``, and
teach ``harness.matrix.expand`` which workload kinds it runs. README.md has the checklist.
"""

from __future__ import annotations

from harness.engines.base import Engine
from harness.engines.llamabench import LlamaBenchEngine
from harness.engines.lmc import LmcEngine
from harness.errors import InputError

ENGINES: dict[str, Engine] = {"lmc": LmcEngine(), "llama-bench": LlamaBenchEngine()}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(f"unknown engine {name!r}; allowed: {', '.join(ENGINES)}") from None
