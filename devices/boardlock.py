"""The lock file in a board's workdir: one benchmark command at a time, whoever sends it.

Board leases in the result store keep coordinators that share a store apart; coordinators with
different stores (two people, two databases) meet only on the board. Each run's remote command
is wrapped in ``flock -n`` on ``.benchfarm-lock`` in the workdir: the lock lives exactly as long
as the command (the kernel drops it when the process ends, so a killed coordinator leaves no
stale lock), and a command that finds it taken does not run at all: it exits with
``LOCKED_EXIT`` and the caller waits and tries again. Boards need ``flock`` (util-linux or
busybox).
"""

from __future__ import annotations

from devices.errors import BoardLocked
from devices.transport import CommandResult

LOCK_FILE = ".benchfarm-lock"
LOCKED_EXIT = 75  # EX_TEMPFAIL: flock's exit code when the lock is taken
# $1 = the lock file, then the command. A lock file that is not a regular file is refused at
# once: flock's open of a FIFO would block until the run's deadline, every run.
LOCK_SCRIPT = f"""
if [ -e "$1" ] && [ ! -f "$1" ]; then
  echo "the board's lock file $PWD/$1 is not a regular file (a FIFO?); remove it" >&2
  exit 1
fi
exec flock -n -E {LOCKED_EXIT} "$@"
"""


def locked(argv: list[str]) -> list[str]:
    """``argv`` run under the board's lock; it does not run if another command holds it."""
    return ["sh", "-c", LOCK_SCRIPT, "sh", LOCK_FILE, *argv]


def check_locked(device: str, workdir: str, result: CommandResult) -> None:
    """Raise BoardLocked when ``result`` is that of a command that found the lock taken."""
    if result.exit_code == LOCKED_EXIT and not result.stderr.strip():
        raise BoardLocked(device, f"its lock file {workdir}/{LOCK_FILE} is held by another "
                                  "coordinator (one that does not share this result store)")
