"""Progress of a matrix on stderr: done / failed / pending / remaining, overall and per device.

On a terminal the line is redrawn in place; otherwise (logs, tests) one line is printed per
finished run so that the output stays readable.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

from harness.errors import printable


class Progress:
    def __init__(self, total: int, boards: list[str], skipped: int = 0,
                 stream: TextIO | None = None) -> None:
        self.total = total
        self.skipped = skipped
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty()
        self.counts: Counter[str] = Counter()
        self.per_board: dict[str, Counter[str]] = {b: Counter() for b in boards}
        self.started = time.monotonic()
        # placement (device or class) -> runs not finished; set by the scheduler
        self.remaining_by: Callable[[], dict[str, int]] | None = None

    @property
    def remaining(self) -> int:
        return self.total - sum(self.counts[s] for s in ("ok", "failed", "pending",
                                                          "interrupted", "elsewhere"))

    def record(self, board: str | None, status: str, label: str = "") -> None:
        """Count one run that reached a final state this session; print the progress."""
        self.counts[status] += 1
        if board is not None:
            self.per_board.setdefault(board, Counter())[status] += 1
        self.show(f"{status:>7} {board or '-'}: {label}")

    def note(self, message: str) -> None:
        """A one-off event (retry, board lost) worth a line of its own."""
        self._write(f"benchfarm: {message}", final=True)

    def summary(self) -> str:
        c = self.counts
        boards = "  ".join(
            f"{name} {n['ok']}/{n['failed']}" for name, n in self.per_board.items()
        )
        if self.remaining_by is not None:
            boards += " | remaining: " + " ".join(
                f"{key} {n}" for key, n in self.remaining_by().items())
        return (f"[{time.monotonic() - self.started:6.1f}s] done {c['ok']} failed {c['failed']} "
                f"pending {c['pending']} remaining {self.remaining} of {self.total}"
                + (f" (skipped {self.skipped} already ok)" if self.skipped else "")
                + (f" | ok/failed per device: {boards}" if boards else ""))

    def show(self, event: str = "") -> None:
        if self.interactive:
            self._write(self.summary(), final=False)
        else:
            self._write(f"{self.summary()} | {event}" if event else self.summary(), final=True)

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")
        self.stream.flush()

    def _write(self, text: str, final: bool) -> None:
        text = printable(text)  # board stderr reaches the notes: no escape sequences
        if self.interactive:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
