"""A step that is the board's, not the commit's, records a board event and opens no alert.
A scratch clone of this repository, real builds of its engine, real runs through the CLI on
boards of this machine (local transport, pinned with taskset), one real SQLite store each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from test_history_git import SLOW, SPEC, THRESHOLD, cli, commit, git
from test_history_names import STEP_LINE

from harness import REPO_ROOT

# Each decode step several ms long (about 5x the scheduler's time slice), so that a process
# sharing the board's core takes its turns inside every step; the tiny model's own step
# (about 0.03 ms) fits in one slice and would not feel it.
LONG = SLOW.replace("600000", "3000000")
# Busy processes on the board's core, each in a session of its own (the scheduler shares a CPU
# between sessions first): the engine gets at most 1/24 of the core, so its steps take over
# twice as long as the night before unless more than 22 other sessions kept that core busy
# then, while its CPU time per step stays (measured here: 0.96 of the wall time the first
# night, 0.044 with them).
BUSY = 23
# Steps over 2x; one revision a night, so the machine's load makes no other step.
BUSY_THRESHOLD = ["--threshold", "1"]

BOARD = """
[[device]]
name = "{name}"
transport = "local"
class = "{cls}"
workdir = "{root}/{name}"
{more}
"""


def scratch_clone(root: Path) -> Path:
    repo = root / "repo"
    git(root, "clone", "-q", str(REPO_ROOT), str(repo))
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    return repo


def setup(root: Path, boards: list[tuple[str, str, str]], measured: str) -> tuple[Path, Path]:
    """An inventory of ``boards`` (name, class, more TOML) and a spec measuring ``measured``."""
    inventory = root / "boards.toml"
    inventory.write_text("".join(BOARD.format(name=name, cls=cls, root=root, more=more)
                                 for name, cls, more in boards))
    spec = root / "spec.toml"
    spec.write_text(SPEC.format(model=REPO_ROOT / "models" / "needle-tiny")
                    .replace('devices = ["local"]', f'devices = ["{measured}"]'))
    return inventory, spec


def board_history(scratch: dict, db: str, inventory: Path, board: str) -> str:
    shown = cli(scratch, db, "devices", "health", board, "--inventory", str(inventory))
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


def alerts(scratch: dict, db: str) -> list[dict]:
    listed = cli(scratch, db, "alerts", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    return json.loads(listed.stdout)


@dataclass
class BusyNight:
    scratch: dict
    inventory: Path
    base: str  # the first night's commit, measured on a quiet core
    commit: str  # the second night's, measured while BUSY processes occupy the core
    second: subprocess.CompletedProcess  # the second night's `track`


def quiet_then_busy(root: Path, db: str, options: list[str], message: str, path: str,
                    edit) -> BusyNight:
    """Two nights of `track` on one board pinned to CPU 0, its decode steps LONG: the first on
    a quiet core, the second after committing ``edit`` of ``path``, while BUSY processes (each
    in a session of its own, killed by process group) occupy that core."""
    repo = scratch_clone(root)
    base = commit(repo, "long decode steps", "engine/cmd_generate.c",
                  lambda t: t.replace(STEP_LINE, LONG + STEP_LINE))
    inventory, spec = setup(root, [("solo", "solo", "cpus = [0]")], "solo")
    scratch = {"root": root, "repo": repo}
    track = ["track", str(spec), "--since", base, "--inventory", str(inventory), *BUSY_THRESHOLD,
             *options]
    first = cli(scratch, db, *track)
    assert first.returncode == 0, first.stderr[-3000:]
    second_commit = commit(repo, message, path, edit)
    busy = [subprocess.Popen(["taskset", "-c", "0", "sh", "-c", "while :; do :; done"],
                             start_new_session=True) for _ in range(BUSY)]
    try:
        second = cli(scratch, db, *track)
    finally:
        for process in busy:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert second.returncode == 0, second.stderr[-3000:]
    return BusyNight(scratch, inventory, base, second_commit, second)


def test_a_step_made_by_a_busy_process_on_the_boards_core_is_a_board_event(
        tmp_path: Path) -> None:
    """Two nights on one board pinned to CPU 0; nothing in the engine's decode changes
    between them (a function nobody calls), but during the second night's runs busy processes
    occupy CPU 0. Its decode steps are several times slower, yet the engine's CPU time per
    step is not: the step records a board event, and no alert opens, without spending the
    confirmation budget."""
    night = quiet_then_busy(tmp_path, "busy.db", ["--confirm-budget", "600"],
                            "a harmless function", "engine/util.c",
                            lambda t: t + "int lmc_harmless(void) { return 1; }\n")
    scratch, inventory, harmless, second = (night.scratch, night.inventory, night.commit,
                                            night.second)
    said = second.stdout + second.stderr[-3000:]
    shown = cli(scratch, "busy.db", "history", "hist", "--json", *BUSY_THRESHOLD).stdout
    assert f"regression at commit {harmless[:12]}" in second.stdout, said + shown
    assert (f"track: board event on solo: a step of decode_ms_per_token at {harmless[:12]} "
            "is the board's, not the commit's: the step is in the wall time of "
            "decode_ms_per_token, not in the engine's CPU time over it"
            in second.stdout), said
    assert "confirmation of" not in second.stdout  # decided from the stored runs alone
    assert alerts(scratch, "busy.db") == []
    assert f"at {harmless[:12]} is the board's" in board_history(scratch, "busy.db", inventory,
                                                                "solo")


def test_a_step_at_a_comment_only_commit_is_the_boards(tmp_path: Path) -> None:
    """A night whose only commit changes a comment, run while busy processes occupy the
    board's core: the same engine code measured slower is a board step (history's
    ``board_steps``), recorded as a board event; no alert and no regression of a commit."""
    night = quiet_then_busy(tmp_path, "same.db", [], "a comment", "engine/util.c",
                            lambda t: t + "/* a comment: the same code */\n")
    scratch, inventory, base, comment, second = (night.scratch, night.inventory, night.base,
                                                 night.commit, night.second)
    said = second.stdout + second.stderr[-3000:]
    shown = json.loads(cli(scratch, "same.db", "history", "hist", "--json",
                           *BUSY_THRESHOLD).stdout)
    assert shown["steps"] == [], shown["steps"]
    (board,) = shown["board_steps"]
    assert (board["revision"], board["previous"], board["device"]) == (comment, base, "solo")
    assert board["ratio"] > 2
    assert ("track: board event on solo: board step on solo: decode_ms_per_token "
            in second.stdout and f"with the engine's code unchanged since {base[:12]}"
            in second.stdout), said
    assert "0 regression(s)" in second.stdout, said
    assert alerts(scratch, "same.db") == []
    assert f"unchanged since {base[:12]}" in board_history(scratch, "same.db", inventory, "solo")


def test_a_step_a_spare_board_does_not_reproduce_is_a_board_event(tmp_path: Path) -> None:
    """Four boards of one class: a commit slows decoding only on pair-a (an environment
    variable its exec_prefix sets, as a kernel chosen by a CPU feature would); pair-b is in
    maintenance and pair-b2 reserved by someone else, both skipped, saying so; pair-c runs
    both revisions and finds them the same: a board event on pair-a, no alert."""
    repo = scratch_clone(tmp_path)
    base = git(repo, "rev-list", "-1", "HEAD", "--", "engine")
    only_a = "        if (getenv(\"LMC_TEST_SLOW_BOARD\"))\n" + SLOW
    slow = commit(repo, "slow decode on one board", "engine/cmd_generate.c",
                  lambda t: t.replace("#include <string.h>\n",
                                      "#include <stdlib.h>\n#include <string.h>\n")
                  .replace(STEP_LINE, only_a + STEP_LINE))
    inventory, spec = setup(tmp_path, [
        ("pair-a", "pair", 'exec_prefix = ["env", "LMC_TEST_SLOW_BOARD=1"]'),
        ("pair-b", "pair", ""), ("pair-b2", "pair", ""), ("pair-c", "pair", "")], "pair-a")
    scratch = {"root": tmp_path, "repo": repo}
    held = cli(scratch, "spare.db", "devices", "state", "pair-b", "maintenance", "--reason",
               "new fan", "--inventory", str(inventory))
    assert held.returncode == 0, held.stderr[-2000:]
    kept = cli(scratch, "spare.db", "reserve", "pair-b2", "--for", "1d", "--owner", "alice",
               "--reason", "her thesis runs", "--inventory", str(inventory))
    assert kept.returncode == 0, kept.stderr[-2000:]
    tracked = cli(scratch, "spare.db", "track", str(spec), "--since", base, "--inventory",
                  str(inventory), *THRESHOLD, "--confirm-budget", "900")
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    said = tracked.stdout + tracked.stderr[-3000:]
    assert f"confirmation of {slow[:12]} against {base[:12]}: different" in tracked.stdout, said
    assert ("track: skipping pair-b for the second measure of the step: it is maintenance "
            "(new fan)" in tracked.stderr), said
    assert ("track: skipping pair-b2 for the second measure of the step: alice has it reserved "
            "until" in tracked.stderr), said
    assert f"on pair-c: confirmation of {slow[:12]} against {base[:12]}: same" \
        in tracked.stdout, said
    assert ("is the board's, not the commit's: not seen on pair-c, a second board of its "
            "class (same)" in tracked.stdout), said
    assert alerts(scratch, "spare.db") == []
    assert f"at {slow[:12]} is the board's" in board_history(scratch, "spare.db", inventory,
                                                             "pair-a")

