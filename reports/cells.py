"""Cells of the report's tables: runs grouped on key columns (None keys kept), the flags of a
cell merged, and every table sorted the same way (numbers as numbers, text naturally), so that
the same database always gives the same rows in the same order.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd


def plain_key(values: Any) -> tuple:
    """A key with NaN as None, so that equal keys compare equal (NaN != NaN)."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in values)


def sorted_table(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, kind="mergesort", na_position="first",
                             key=_sort_key).reset_index(drop=True)


def natural_key(text: Any) -> tuple:
    """Text with its digit runs compared as numbers: "sparse k=4" before "sparse k=32"."""
    parts = re.split(r"(\d+)", str(text))
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _sort_key(column: pd.Series) -> pd.Series:
    """Numbers sort as numbers, text naturally (digit runs as numbers); None first."""
    if pd.api.types.is_numeric_dtype(column):
        return column
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().sum() == column.notna().sum():
        return numeric
    return column.map(natural_key)


def group_cells(frame: pd.DataFrame, keys: list[str]):
    """groupby that keeps None keys (pandas drops them by default) in a stable order."""
    return frame.groupby(keys, dropna=False, sort=True)


def merge_flags(values: pd.Series) -> str:
    seen: dict[str, None] = {}
    for text in values:
        for flag in str(text or "").split("; "):
            if flag and flag != "ok":
                seen[flag] = None
    return "; ".join(sorted(seen))
