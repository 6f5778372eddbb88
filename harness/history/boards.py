"""Is a step the board's or the commit's? What `track` checks before it blames a commit.

- ``cpu_waiting``: the engine measures the CPU time of its own process over the span of the
  metric (``db.records.CPU_FIGURES``: lmc's ``decode_cpu_ms_per_token`` beside
  ``decode_ms_per_token``). Its share of the wall time drops when another process occupies the
  board's cores (the engine waits for its CPUs) and stays when a commit makes the engine do more
  work. A step whose runs had less than half the share of the runs before it is the board's.
  It reads only what the runs stored, so `track` asks it before spending time on confirmation.
  A commit that makes the engine sleep or wait on I/O lowers the share too; the engine's
  kernels do neither.
- ``board_change``: a condition of the snapshots around the runs (``devices.conditions``: a
  governor, throttling, a memory clock, a loaded machine) under most runs of one side and none
  of the other.
- ``reproduce``: the step confirmed again on another board of the class (``spares``: each in
  turn, skipping one that is not online or is reserved, and one whose runs do not complete);
  a step that board does not show is the first board's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from db.boards import ONLINE
from db.records import CPU_FIGURES
from devices.conditions import EMULATED, run_flags
from harness.errors import RunFailure
from harness.history.confirm import Confirmation, confirm
from harness.history.measure import BuildFailed, Measurer
from reports.commits import CommitSummary

CPU_SHARE_DROP = 0.5  # a step's runs with less than this part of the share before: waiting

Snapshots = tuple[Any, Any]  # a run's fingerprints before and after it


def condition_shares(runs: list[Snapshots]) -> dict[str, float]:
    """condition -> the share of the runs measured under it (``devices.conditions`` flags but
    ``emulated``)."""
    counted: dict[str, int] = {}
    for before, after in runs:
        for flag in set(run_flags(before, after)) - {EMULATED}:
            counted[flag] = counted.get(flag, 0) + 1
    return {flag: n / len(runs) for flag, n in counted.items()}


def measured_conditions(measurer: Measurer, revision: str, configs: list[str]
                        ) -> dict[str, float]:
    """``condition_shares`` of the runs of these configs at ``revision`` (their snapshots)."""
    pairs = []
    runs = measurer.results(revision)
    for config in configs:
        for run in runs.get(config, []):
            snapshots = {s.get("phase"): s.get("fingerprint")
                         for s in measurer.store.get_run(run.run_id).snapshots}
            pairs.append((snapshots.get("before"), snapshots.get("after")))
    return condition_shares(pairs)


def board_change(before: dict[str, float], after: dict[str, float], previous: str,
                 revision: str) -> str | None:
    """What changed on the board between the runs before a step (``before``: condition
    shares at ``previous``) and the culprit's (``after``): a condition under most runs of one
    side and none of the other (a passing load, which the alternating rounds spread over both
    sides, is no change), or None."""
    parts = []
    for flag in sorted(set(before) | set(after)):
        for here, there, at in ((after, before, revision), (before, after, previous)):
            if here.get(flag, 0.0) > 0.5 and flag not in there:
                parts.append(f"{flag} in {here[flag]:.0%} of the runs at {at[:12]}, none at "
                             "the other")
    return "; ".join(parts) or None


def cpu_shares(measurer: Measurer, revision: str, config: str, metric: str) -> list[float]:
    """Each run's share of the CPU over ``metric``'s span at ``revision``: the process CPU
    time its engine measured over the wall time (``CPU_FIGURES``); runs whose engine measured
    none are left out."""
    key = CPU_FIGURES.get(metric)
    shares = []
    for run in measurer.results(revision).get(config, []) if key else []:
        outcome = measurer.store.get_run(run.run_id).outcome or {}
        cpu, wall = (outcome.get("extra") or {}).get(key), run.values.get(metric)
        if isinstance(cpu, int | float) and wall:
            shares.append(cpu / wall)
    return shares


def cpu_waiting(measurer: Measurer, previous: str, revision: str, configs: list[str],
                metric: str) -> str | None:
    """How the engine waited for its CPUs at ``revision``: every config of ``configs`` with
    CPU figures on both sides had, at the median, less than ``CPU_SHARE_DROP`` of the share it
    had at ``previous``; None when one did not, or none has the figures."""
    parts = []
    for config in configs:
        before = cpu_shares(measurer, previous, config, metric)
        after = cpu_shares(measurer, revision, config, metric)
        if not before or not after:
            continue
        had, has = statistics.median(before), statistics.median(after)
        if has >= CPU_SHARE_DROP * had:
            return None
        parts.append(f"{config}: {has:.0%} at {revision[:12]}, {had:.0%} at {previous[:12]}")
    if not parts:
        return None
    return (f"the engine had less than half its CPU time over {metric} (process CPU time / "
            f"wall time; {'; '.join(parts)}): it waited for its CPUs, which another process "
            "occupied")


def spares(measurer: Measurer, devices: list[str]) -> list[str]:
    """The inventory's boards of the classes of ``devices`` that ``measurer`` does not run
    on, by name."""
    boards = measurer.inventory.devices
    classes = {boards[name].cls for name in devices if name in boards}
    return sorted(b.name for b in boards.values()
                  if b.cls in classes and b.name not in measurer.placement.devices)


def unusable(measurer: Measurer, board: str) -> str | None:
    """Why ``board`` cannot reproduce a step now (its state, another's reservation), or None."""
    state = measurer.store.boards.states([board])[board]
    if state.state != ONLINE:
        return f"it is {state.state}" + (f" ({state.reason})" if state.reason else "")
    held = measurer.store.boards.reservations([board]).get(board)
    if held is not None and (measurer.caller is None or held.owner != measurer.caller.name):
        return f"{held.owner} has it reserved until {held.ends:%Y-%m-%d %H:%M} UTC"
    return None


def reproduce(measurer: Measurer, summary: CommitSummary, metric: str, threshold: float,
              deadline: float, say: Callable[[str], None]) -> tuple[str, Confirmation] | None:
    """The step confirmed again on another board of its board's class: each of ``spares`` in
    turn until one measures it (both revisions built for it and run there, then
    ``confirm``ed until ``deadline``, time.monotonic()); one that is ``unusable`` or whose runs
    do not complete is skipped, said with why. None when no spare measured it."""
    if summary.previous is None:
        return None
    revisions = [summary.previous, summary.revision]
    for board in spares(measurer, summary.devices):
        why = unusable(measurer, board)
        if why is None and time.monotonic() >= deadline:
            why = "the confirmation budget is spent"
        if why is None:
            say(f"track: reproducing the step at {summary.revision[:12]} on {board}")
            with Measurer(measurer.spec, measurer.inventory, measurer.store, board,
                          measurer.ray_address, measurer.stream, measurer.caller) as second:
                try:
                    for revision in revisions:
                        second.build(revision)
                    second.run(revisions)
                    lacking = second.missing(revisions)
                except (BuildFailed, RunFailure) as exc:
                    lacking, why = revisions, str(exc).splitlines()[0]
                if not lacking:
                    return board, confirm(second, summary, metric, threshold, deadline, say)
                why = why or ("its runs at " + ", ".join(r[:12] for r in lacking)
                              + " did not complete (busy, lost or failed)")
        say(f"track: skipping {board} for the second measure of the step: {why}")
    return None
