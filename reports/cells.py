"""Cells of the report's tables: runs grouped on key columns (None keys kept), the flags of a
cell merged, and every table sorted the same way (numbers as numbers, text naturally), so that
the same database always gives the same rows in the same order.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd


def plain_key(values: Any) -> tuple:
    """A key with NaN as None, so that equal keys compare equal (NaN != NaN)."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in values)


def sorted_table(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, kind="mergesort", na_position="first",
                             key=_sort_key).reset_index(drop=True)


DIGITS = re.compile(r"(\d+)")


def natural_key(text: Any) -> tuple:
    """Text with its digit runs compared as numbers: "sparse k=4" before "sparse k=32"."""
    parts = DIGITS.split(str(text))
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _sort_key(column: pd.Series) -> pd.Series:
    """Numbers sort as numbers, text naturally (digit runs as numbers); None first."""
    if pd.api.types.is_numeric_dtype(column):
        return column
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().sum() == column.notna().sum():
        return numeric
    keys: dict[Any, tuple] = {}  # each distinct text split once (devices, kinds repeat)
    return pd.Series([keys[v] if v in keys else keys.setdefault(v, natural_key(v))
                      for v in column.tolist()], index=column.index, dtype=object)


def group_cells(frame: pd.DataFrame, keys: list[str]):
    """groupby that keeps None keys (pandas drops them by default) in a stable order."""
    return frame.groupby(keys, dropna=False, sort=True)


def cell_rows(frame: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, np.ndarray]]:
    """``group_cells`` without a frame per cell: each cell's key (as iterating the groupby
    gives it) and the positions of its rows in ``frame``, in frame order. One groupby for
    all cells; what a cell needs is then read from column lists by position (a frame per
    cell costs milliseconds, and a nightly history has tens of thousands of cells)."""
    if frame.empty:
        return []
    grouped = group_cells(frame, keys)
    codes = grouped.ngroup().to_numpy()
    index = grouped.size().index
    names = list(index) if isinstance(index, pd.MultiIndex) else [(key,) for key in index]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return [(name, order[bounds[i]:bounds[i + 1]]) for i, name in enumerate(names)]


def merge_flags(values: pd.Series) -> str:
    seen: dict[str, None] = {}
    for text in values:
        for flag in str(text or "").split("; "):
            if flag and flag != "ok":
                seen[flag] = None
    return "; ".join(sorted(seen))
