"""A board's physical limits as its health checks measured them (``harness.lab.health``'s
limit probes: memory read bandwidth, FMA peak), kept in the checks' items as
``{"name", "ok", "detail", "key", "value"}`` (the read bandwidth also by buffer size). The
newest measured value of each key counts."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, select

from db.models import HealthCheck
from db.rows import chunks

READ_GBPS = "read_gbps"  # memory read bandwidth, GB/s, every thread of the board
READ_CURVE = "read_gbps_by_mib"  # {buffer MiB: GB/s}: from inside the caches to memory
FMA_GFLOPS = "fma_gflops"  # fused multiply-add peak, GFLOP/s per core
LIMIT_KEYS = (READ_GBPS, FMA_GFLOPS)
CHECKS_READ = 20  # newest checks of a board looked through for its figures


def board_limits(conn: Connection, boards: Collection[str]) -> dict[str, dict[str, Any]]:
    """board -> {key: the newest value its health checks measured} (and the read bandwidth
    by buffer size, ``READ_CURVE``, of the same check), for boards with any."""
    found: dict[str, dict[str, Any]] = {}
    for batch in chunks(sorted(set(boards))):
        rows = conn.execute(select(HealthCheck.board, HealthCheck.items)
                            .where(HealthCheck.board.in_(batch))
                            .order_by(HealthCheck.id.desc())).all()
        seen: dict[str, int] = {}
        for board, items in rows:
            seen[board] = seen.get(board, 0) + 1
            if seen[board] > CHECKS_READ:
                continue
            for item in items or []:
                key, value = item.get("key"), item.get("value")
                if key not in LIMIT_KEYS or not isinstance(value, int | float) or value <= 0 \
                        or key in found.get(board, {}):
                    continue
                found.setdefault(board, {})[key] = float(value)
                curve = item.get(READ_CURVE)
                if key == READ_GBPS and isinstance(curve, dict):
                    found[board][READ_CURVE] = {str(mib): float(gbps)
                                                for mib, gbps in curve.items()}
    return found
