"""A SIGTERM that arrives while a serve stores a job's end waits until its notification is
announced (a serve stopped right after a job ended once lost the job's end event)."""

import subprocess
import sys
from pathlib import Path

CHILD = """
import os, signal, sys
from pathlib import Path
from harness.errors import Terminated, sigterm_as_interrupt, sigterm_held
sigterm_as_interrupt()
log = Path(sys.argv[1])
try:
    with sigterm_held():
        os.kill(os.getpid(), signal.SIGTERM)
        log.write_text("stored\\n")  # the block goes on past the signal
        with log.open("a") as f:
            f.write("announced\\n")
    log.open("a").write("after the block\\n")
except Terminated:
    log.open("a").write("terminated\\n")
"""


def test_a_sigterm_inside_the_block_is_raised_when_it_ends(tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["stored", "announced", "terminated"]
