"""Tables as Markdown, HTML and CSV, with one formatting rule for every number.

Numbers are formatted with fixed precision so that the same data always gives the same text.
A row with a non-empty ``flags`` column is marked (``flagged`` class in HTML, ``⚑`` in Markdown).
"""

from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

FLOAT_FORMAT = "%.6g"
# The style of every page (report, compare, audit): inline, so pages stay self-contained.
CSS = """
body{font-family:sans-serif;margin:24px;max-width:1400px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}tr.flagged td{background:#fff4e0}
.figs{display:flex;flex-wrap:wrap;gap:12px}.figs figure{margin:0}
figcaption{font-size:11px;color:#555}pre{background:#f7f7f7;padding:8px;font-size:12px;overflow:auto}
.note{font-size:12px;color:#555}.verdict-reproduced{color:#1a7f37}
.verdict-not-reproduced{color:#c0392b}.verdict-not-comparable{color:#8a6d3b}
.verdict-inconclusive{color:#6a5acd}
.verdict-direction-holds,.verdict-consistent,.verdict-verified,.verdict-sanity-holds{color:#1a7f37}
.verdict-direction-fails,.verdict-inconsistent,.verdict-refuted,.verdict-sanity-fails{color:#c0392b}
.verdict-holds-check-unproven,.verdict-precondition-absent{color:#8a6d3b}
td details{text-align:left;max-width:640px}dl{margin:4px 0}dt{font-weight:bold}
dd{margin:0 0 4px 12px}
"""


def fmt(value: Any, digits: int = 3) -> str:
    """A cell as text: None/NaN empty, integral floats without decimals, others `digits` sig."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.{digits}g}" if abs(value) >= 1e-3 else f"{value:.2e}"
    return str(value)


def summary_text(median: Any, low: Any, high: Any, digits: int = 3) -> str:
    """``median [min, max]``; just the median when all three agree (a single run)."""
    if median is None or (isinstance(median, float) and math.isnan(median)):
        return ""
    if low == high == median:
        return fmt(float(median), digits)
    return f"{fmt(float(median), digits)} [{fmt(float(low), digits)}, {fmt(float(high), digits)}]"


def cell_texts(frame: pd.DataFrame) -> list[list[str]]:
    """Every cell of ``frame`` as ``fmt`` writes it, row by row (what to_html and to_markdown
    show; a report computes them once for both)."""
    return [[fmt(v) for v in row] for row in frame.itertuples(index=False, name=None)]


# Characters that would make text in markdown something other than text: a table cell's end,
# a code span, a link; and the backslash that escapes them.
MARKDOWN_SPECIAL = re.compile(r"([\\|`\[\]])")


# What markdown_text changes: line breaks (as str.splitlines finds them), what HTML escapes,
# MARKDOWN_SPECIAL; text without any of them (most cells: numbers, names) is left as it is.
MARKDOWN_CHANGED = re.compile(r"[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029&<>\\|`\[\]]")


def markdown_text(text: str) -> str:
    """Untrusted text (board stderr, names) as literal markdown on one line: HTML escaped as the
    HTML report escapes it (markdown viewers render inline HTML), markdown syntax
    backslash-escaped, line breaks as spaces."""
    if not MARKDOWN_CHANGED.search(text):
        return text
    flat = " ".join(text.splitlines())
    return MARKDOWN_SPECIAL.sub(r"\\\1", escape(flat, quote=False))


def to_markdown(frame: pd.DataFrame, cells: list[list[str]] | None = None) -> str:
    """``frame`` as a markdown table; ``cells``: its ``cell_texts``, when known."""
    if frame.empty:
        return "_(no rows)_\n"
    header = [markdown_text(str(c)) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    flag_index = header.index("flags") if "flags" in header else None
    for row in cell_texts(frame) if cells is None else cells:
        row = [markdown_text(c) for c in row]
        if flag_index is not None and row[flag_index]:
            row[flag_index] = "⚑ " + row[flag_index]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def to_html(frame: pd.DataFrame, table_id: str, cells: list[list[str]] | None = None) -> str:
    """``frame`` as an HTML table; ``cells``: its ``cell_texts``, when known."""
    if frame.empty:
        return f'<p class="empty" id="{escape(table_id)}">(no rows)</p>'
    header = [str(c) for c in frame.columns]
    flag_index = header.index("flags") if "flags" in header else None
    out = [f'<table id="{escape(table_id)}"><thead><tr>'
           + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for row in cell_texts(frame) if cells is None else cells:
        flagged = flag_index is not None and row[flag_index]
        out.append(('<tr class="flagged">' if flagged else "<tr>")
                   + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    safe_cells(frame).to_csv(path, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")


# What a spreadsheet reads as the start of a formula (OWASP's list): board stderr such as
# =HYPERLINK(...) lands in failures.csv and the export's runs.csv. Spreadsheets skip leading
# white space and control characters before one, so those are looked through.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")
LEADING = "".join(chr(c) for c in (*range(0x20), 0x7f, *range(0x80, 0xa1))) + " \u2028\u2029"


# a cell neutral may change: one that starts with a formula's start or what is looked through
# before one, or holds a carriage return
NEUTRAL_CHANGES = re.compile("^[" + re.escape(LEADING + "=+-@") + "]|\r")


def neutral(value: object) -> object:
    r"""A text cell as written: a line break is written as ``\n`` (the CSV writer quotes a cell
    holding one; a lone ``\r`` it did not quote split the row), and one that a spreadsheet
    would run as a formula (``= + - @``, after any white space or control characters, or a
    leading tab or line break) is prefixed by a single quote, which spreadsheets show as
    text."""
    if not isinstance(value, str):
        return value
    value = value.replace("\r\n", "\n").replace("\r", "\n")
    if value.startswith(FORMULA_STARTS) or value.lstrip(LEADING).startswith(FORMULA_STARTS[:4]):
        return f"'{value}"
    return value


def safe_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell ``neutral``; numbers (a negative one too) are kept."""
    text = [c for c in frame.columns if pd.api.types.is_object_dtype(frame[c])
            or pd.api.types.is_string_dtype(frame[c])]
    if not text:
        return frame
    safe = frame.copy()
    for column in text:
        values = safe[column]
        if isinstance(values.dtype, pd.StringDtype) and not values.str.contains(
                NEUTRAL_CHANGES).fillna(False).any():
            continue  # text only, no cell neutral changes: the same column, as map gives it
        safe[column] = values.map(neutral)
    return safe
