"""Process bookkeeping for the local farm, read from /proc (Linux).

A pid alone is not an identity: the kernel recycles pids. The farm therefore records each
process's start time (field 22 of /proc/<pid>/stat) and only signals a pid whose start time
still matches, plus that process's descendants.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends

# Popen objects of processes this Python process started, so their exit can be reaped.
_adopted: dict[int, subprocess.Popen] = {}


def adopt(proc: subprocess.Popen) -> None:
    _adopted[proc.pid] = proc


def ending_with_caller(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` by which the child is sent ``sig`` when the thread that starts it ends
    (Linux's parent-death signal: it comes even when this process is SIGKILLed). A child whose
    parent ended before the signal was armed sends it to itself."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    parent = os.getpid()

    def arm() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def reap(pid: int) -> None:
    """Collect the exit status of a child of ours that has died (no-op otherwise)."""
    proc = _adopted.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _adopted[pid]
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int) -> bool:
    """True if the pid exists and is not a zombie (a zombie of ours is reaped on the way)."""
    fields = _stat_fields(pid)
    if fields is None:
        return False
    if fields[0] == "Z":
        reap(pid)
        return False
    return True


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (children first, depth-first order)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, []))
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and its descendants at once (a crash, as far as clients can tell)."""
    pids = [pid, *descendants(pid)]
    _signal_all(pids, signal.SIGKILL)
    _wait_gone(pids, 5.0)
    return pids


def stop_tree(pid: int, timeout: float) -> list[int]:
    """SIGTERM a process and its descendants; SIGKILL whatever is left after ``timeout``."""
    pids = [pid, *descendants(pid)]
    _signal_all(pids, signal.SIGTERM)
    if not _wait_gone(pids, timeout):
        _signal_all([p for p in pids if alive(p)], signal.SIGKILL)
        _wait_gone(pids, timeout)
    return pids


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return not any(alive(p) for p in pids)
