"""The result store: SQLAlchemy models, Alembic migrations, and the Store API (see README.md)."""

from db.errors import StoreError, StoreInputError
from db.records import RUN_STATUSES, Outcome, RunResult, Snapshot, TokenTiming, timings_from_steps
from db.store import Store

__all__ = [
    "RUN_STATUSES",
    "Outcome",
    "RunResult",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreInputError",
    "TokenTiming",
    "timings_from_steps",
]
