"""Errors the command line turns into exit codes.

Every project exception that a user can act on carries an ``exit_code`` class attribute:
2 for bad input (a file, a flag, a name), 1 for a failure while running. ``devices`` and ``db``
follow the same convention without importing this module (they import none of the others).
"""

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class BenchfarmError(Exception):
    exit_code = 1


class InputError(BenchfarmError):
    """The user gave something invalid: a file, a key, a flag value."""

    exit_code = 2


class RunFailure(BenchfarmError):
    """Something failed while running (a build, a remote command, a store write)."""

    exit_code = 1


# C0 controls but for the tab, DEL and C1 controls: what a terminal would act on (escape
# sequences in a board's stderr could retitle, clear or rewrite it)
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0a, 0x20), 0x7f,
                                          *range(0x80, 0xa0))}


def printable(text: str) -> str:
    """``text`` with every terminal control character written as ``\\xNN``."""
    return text.translate(_CONTROLS)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`, `ray job stop`, systemd): handled like Ctrl-C."""


_terminated: list[int] = []  # the SIGTERMs received (libraries may re-raise a plain
# KeyboardInterrupt in place of ours, so the CLI asks terminated() instead of the type)


def _raise_terminated(signum: int, _frame: object) -> None:
    _terminated.append(signum)
    raise Terminated


def terminated() -> bool:
    """Whether this process received SIGTERM."""
    return bool(_terminated)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM raise Terminated in the main thread (ray.init installs its own handler,
    which exits at once, so call this again after it)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM held back until the block ends, then delivered to the
    handler they would have reached: what the block writes goes together (a run's attempt
    stored as running and the record that it is in flight; a job's end and its notification).
    A second signal inside the block is delivered at once, so that a block waiting on a
    locked store can still be stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: nothing to hold here
        return
    # a handler installed outside Python reads as None and cannot be put back: left alone
    previous = {signum: handler for signum in (signal.SIGINT, signal.SIGTERM)
                if (handler := signal.getsignal(signum)) is not None}
    held: list[int] = []

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def hold(signum: int, _frame: object) -> None:
        if not held:
            held.append(signum)
            return
        held.clear()  # the second one: as if the block were not there
        restore()
        os.kill(os.getpid(), signum)

    for signum in previous:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        restore()
        if held:
            os.kill(os.getpid(), held[0])
