"""Ctrl-C and SIGTERM that arrive inside ``interrupts_held`` wait until its block ends (a serve
stopped right after a job ended once lost the job's end event; a Ctrl-C between storing a run's
attempt and sending it to the board once left the attempt running forever); a second signal
inside the block is delivered at once."""

import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import os, signal, sys
from pathlib import Path
from harness.errors import Terminated, interrupts_held, sigterm_as_interrupt
# as a terminal's Ctrl-C finds the CLI (a suite started in the background hands its children
# SIGINT ignored, and a Python started so keeps ignoring it)
signal.signal(signal.SIGINT, signal.default_int_handler)
sigterm_as_interrupt()
log, signals = Path(sys.argv[1]), [getattr(signal, name) for name in sys.argv[2:]]
log.write_text("")
try:
    with interrupts_held():
        for signum in signals:
            os.kill(os.getpid(), signum)
            log.open("a").write("went on\\n")  # the block goes on past a first signal
        log.open("a").write("block ended\\n")
    log.open("a").write("after the block\\n")
except Terminated:
    log.open("a").write("terminated\\n")
except KeyboardInterrupt:
    log.open("a").write("interrupted\\n")
log.open("a").write("handlers " + str(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
                    + "\\n")
"""


def run_child(tmp_path: Path, *signals: str) -> list[str]:
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-c", CHILD, str(log), *signals], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


@pytest.mark.parametrize(("name", "raised"), [("SIGTERM", "terminated"),
                                              ("SIGINT", "interrupted")])
def test_a_signal_inside_the_block_is_raised_when_it_ends(tmp_path: Path, name: str,
                                                          raised: str) -> None:
    assert run_child(tmp_path, name) == ["went on", "block ended", raised, "handlers True"]


def test_a_second_signal_inside_the_block_is_raised_at_once(tmp_path: Path) -> None:
    assert run_child(tmp_path, "SIGINT", "SIGINT") == ["went on", "interrupted", "handlers True"]
    assert run_child(tmp_path, "SIGINT", "SIGTERM") == ["went on", "terminated", "handlers True"]


def test_no_signal_leaves_the_handlers_as_they_were(tmp_path: Path) -> None:
    assert run_child(tmp_path) == ["block ended", "after the block", "handlers True"]
