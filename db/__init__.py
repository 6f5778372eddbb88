"""The result store: SQLAlchemy models, Alembic migrations, and the Store API (see README.md).

The names below are loaded on first use, so that importing a light submodule (``db.errors``,
``db.lmc_axes``) does not import SQLAlchemy and pandas: the command line builds its parser
without them.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "StoreError": "db.errors",
    "StoreInputError": "db.errors",
    "RUN_STATUSES": "db.records",
    "Outcome": "db.records",
    "RunResult": "db.records",
    "Snapshot": "db.records",
    "TokenTiming": "db.records",
    "timings_from_steps": "db.records",
    "Store": "db.store",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'db' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
