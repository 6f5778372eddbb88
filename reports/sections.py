"""A report's building blocks: its tables (the data written to CSV, the view shown) and its
sections (a title, a text, tables, figures), which ``reports.render`` writes as HTML and
Markdown and ``benchfarm web`` shows on an experiment's page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from reports.tables import cell_texts


@dataclass
class Table:
    name: str  # also the CSV file name
    data: pd.DataFrame  # written to CSV as is
    display: pd.DataFrame | None = None  # what the HTML and Markdown show (default: data)
    caption: str = ""  # a line shown above the table
    # shown and its cells, worked out once for the HTML and the markdown (never change a
    # table's frames after showing it)
    _known: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def shown(self) -> pd.DataFrame:
        """What people see: the display table, without columns that are empty everywhere."""
        if "shown" not in self._known:
            self._known["shown"] = self._shown()
        return self._known["shown"]

    @property
    def cells(self) -> list[list[str]]:
        """``shown``'s cells as the HTML and markdown write them (``tables.cell_texts``)."""
        if "cells" not in self._known:
            self._known["cells"] = cell_texts(self.shown)
        return self._known["cells"]

    def _shown(self) -> pd.DataFrame:
        frame = self.data if self.display is None else self.display
        if not len(frame):
            return frame
        empty = [c for c in frame.columns if all(
            v is None or v == "" or (isinstance(v, float) and pd.isna(v))
            for v in frame[c].tolist())]  # stops at a column's first value shown
        return frame.drop(columns=empty)


@dataclass
class Section:
    anchor: str
    title: str
    text: str = ""  # an introduction (plain text, shown in both formats)
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (caption, svg)
    html_extra: str = ""  # pre-rendered HTML (e.g. the audit)
    markdown_extra: str = ""
    always: bool = False  # shown even when empty (manifest, failures: "none" is news)

    def has_content(self) -> bool:
        return (self.always or bool(self.figures) or bool(self.html_extra)
                or any(not t.data.empty for t in self.tables))
