"""The plain-text tables the commands print.

Text that others wrote (reasons, owners, messages, board output) reaches the terminal as
``shown`` makes it: control characters escaped as board output is (``harness.errors.printable``:
no escape sequence, no ``\r`` overwriting a line) and cut to ``MAX_SHOWN_CHARS``.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.errors import printable

MAX_SHOWN_CHARS = 500  # of one cell or one free-text field printed


def shown(value: object) -> str:
    """Free text as printed: terminal controls escaped, cut to MAX_SHOWN_CHARS."""
    text = printable(str(value))
    if len(text) > MAX_SHOWN_CHARS:
        return f"{text[:MAX_SHOWN_CHARS]}... ({len(text) - MAX_SHOWN_CHARS} more characters)"
    return text


def cell(value: object, digits: int = 2) -> str:
    """A table cell: '-' for missing values, floats rounded to ``digits``, text ``shown``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return shown(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: left-aligned text, right-aligned numbers, '-' for missing values."""
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, texts)])
