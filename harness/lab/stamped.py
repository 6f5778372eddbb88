"""`benchfarm serve`'s output, every line led by the UTC time it was written
(``2026-12-05T01:02:03Z``): a long-running service's log says when each thing happened."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TextIO


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Stamped:
    """A text stream that writes to ``stream`` with ``stamp()`` and a space at each line's
    start (a line written in pieces is stamped once)."""

    def __init__(self, stream: TextIO, stamp: Callable[[], str] = utc_stamp) -> None:
        self.stream = stream
        self.stamp = stamp
        self._at_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_start:
                out.append(f"{self.stamp()} ")
            out.append(piece)
            self._at_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> object:  # fileno, isatty, encoding ...: the stream's
        return getattr(self.stream, name)


@contextmanager
def stamped_output() -> Iterator[None]:
    """Stamp every line this process prints to stdout and stderr while inside."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Stamped(sys.stdout), Stamped(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
