"""How the bulky raw data of a measurement is kept small, losing nothing.

- The engine's JSON document (``measurements.raw_json``) and each device fingerprint
  (``device_snapshots.fingerprint``) are stored zlib-compressed (``CompressedText``,
  ``CompressedJSON``: SQLAlchemy column types, so every read and write sees the text and the
  dict as before). Both are repetitive text: a third to a half of their size remains.
- A measurement's decode steps are one row (``decode_steps``) of three packed arrays instead of
  a row per step: the tokens as 32-bit little-endian integers, the step and attention times as
  64-bit little-endian floats (the engine prints decimal milliseconds that a double holds
  exactly as Python reads them), attention times NaN where a step has none, and the column
  NULL when no step has one (engines that do not time attention).
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

from sqlalchemy import LargeBinary
from sqlalchemy.types import TypeDecorator

from db.records import TokenTiming

LEVEL = 6  # zlib's default: most of the gain, at a few hundred MB/s
# the packed arrays as numpy reads them (db.frames unpacks an experiment's steps at once):
# tokens 32-bit little-endian integers (array "i"), times 64-bit little-endian floats ("d")
STEP_TOKENS, STEP_TIMES = "<i4", "<f8"


class CompressedText(TypeDecorator):
    """Text kept zlib-compressed (UTF-8)."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> bytes | None:
        return None if value is None else zlib.compress(value.encode(), LEVEL)

    def process_result_value(self, value: bytes | None, dialect: Any) -> str | None:
        return None if value is None else zlib.decompress(value).decode()


class CompressedJSON(TypeDecorator):
    """A JSON document kept zlib-compressed; its keys keep their order."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> bytes | None:
        if value is None:
            return None
        return zlib.compress(json.dumps(value, separators=(",", ":")).encode(), LEVEL)

    def process_result_value(self, value: bytes | None, dialect: Any) -> Any:
        return None if value is None else json.loads(zlib.decompress(value))


def _little_endian(values: array) -> bytes:
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def _unpacked(kind: str, data: bytes) -> array:
    values = array(kind)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def pack_steps(timings: Sequence[TokenTiming]) -> dict[str, Any]:
    """The ``decode_steps`` columns of a measurement's steps, which are numbered 0, 1, ... in
    order (ValueError otherwise: a step's number is its place)."""
    if [t.step for t in timings] != list(range(len(timings))):
        raise ValueError("decode steps must be numbered 0, 1, 2 ... in order, got "
                         f"{[t.step for t in timings][:10]}")
    attn = [t.attn_ms for t in timings]
    return {
        "steps": len(timings),
        "tokens": _little_endian(array("i", [t.token for t in timings])),
        "ms": _little_endian(array("d", [t.ms for t in timings])),
        "attn_ms": None if all(a is None for a in attn) else _little_endian(
            array("d", [math.nan if a is None else a for a in attn])),
    }


def unpack_steps(tokens: bytes, ms: bytes, attn_ms: bytes | None) -> list[TokenTiming]:
    """The steps ``pack_steps`` packed."""
    token_values, ms_values = _unpacked("i", tokens), _unpacked("d", ms)
    attn = [None] * len(token_values) if attn_ms is None else [
        None if math.isnan(a) else a for a in _unpacked("d", attn_ms)]
    return [TokenTiming(step=i, token=t, ms=m, attn_ms=a)
            for i, (t, m, a) in enumerate(zip(token_values, ms_values, attn, strict=True))]
