"""Is a step the board's or the commit's? What `track` checks before it blames a commit.

- ``cpu_waiting``: the engine measures the CPU time of its own process over the span of the
  metric (``db.records.CPU_FIGURES``: lmc's ``decode_cpu_ms_per_token`` beside
  ``decode_ms_per_token``). A commit that makes the engine do more work raises both; another
  process on the board's cores raises only the wall time (the engine waits for its CPUs). A
  step whose CPU time grew by less than half of it (on a log scale) is the board's. The share
  of CPU time alone would not do: a step of a few microseconds fits in one time slice of the
  scheduler and never waits, so a slower commit's longer steps lose share on a loaded board
  that the fast ones never showed. It reads only what the runs stored, so `track` asks it
  before spending time on confirmation. A commit that makes the engine sleep or wait on I/O
  looks the same; the engine's kernels do neither.
- ``board_change``: a condition of the snapshots around the runs (``devices.conditions``: a
  governor, throttling, a memory clock, a loaded machine where the engine did not time its own
  CPU) under most runs of one side and none of the other.
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
from devices.conditions import EMULATED, LOADED, run_flags
from harness.errors import RunFailure
from harness.history.confirm import Confirmation, confirm
from harness.history.measure import BuildFailed, Measurer
from reports.commits import CommitSummary

Snapshots = tuple[Any, Any]  # a run's fingerprints before and after it


def condition_shares(runs: list[Snapshots], cpu_timed: list[bool] | None = None
                     ) -> dict[str, float]:
    """condition -> the share of the runs measured under it (``devices.conditions`` flags but
    ``emulated``). A run whose engine timed its own CPU over the metric (``cpu_timed``) leaves
    ``loaded`` out: ``cpu_waiting`` judges from that time whether the engine waited for its
    CPUs, where the machine's load average only hints at it (and, on a shared machine, would
    fall on one side by chance)."""
    counted: dict[str, int] = {}
    for i, (before, after) in enumerate(runs):
        ignored = {EMULATED, LOADED} if cpu_timed and cpu_timed[i] else {EMULATED}
        for flag in set(run_flags(before, after)) - ignored:
            counted[flag] = counted.get(flag, 0) + 1
    return {flag: n / len(runs) for flag, n in counted.items()}


def measured_conditions(measurer: Measurer, revision: str, configs: list[str], metric: str
                        ) -> dict[str, float]:
    """``condition_shares`` of the runs of these configs at ``revision`` (their snapshots;
    whether the engine timed its CPU over ``metric``, ``CPU_FIGURES``)."""
    pairs, timed_runs = [], []
    runs = measurer.results(revision)
    key = CPU_FIGURES.get(metric)
    for config in configs:
        for run in runs.get(config, []):
            stored = measurer.store.get_run(run.run_id)
            snapshots = {s.get("phase"): s.get("fingerprint") for s in stored.snapshots}
            pairs.append((snapshots.get("before"), snapshots.get("after")))
            extra = (stored.outcome or {}).get("extra") or {}
            timed_runs.append(bool(key) and isinstance(extra.get(key), int | float))
    return condition_shares(pairs, timed_runs)


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


def timed(measurer: Measurer, revision: str, config: str, metric: str
          ) -> list[tuple[float, float]]:
    """(wall, CPU) of each run at ``revision`` over ``metric``'s span: the metric and the
    process CPU time its engine measured over it (``CPU_FIGURES``); runs whose engine measured
    none are left out."""
    key = CPU_FIGURES.get(metric)
    found = []
    for run in measurer.results(revision).get(config, []) if key else []:
        outcome = measurer.store.get_run(run.run_id).outcome or {}
        cpu, wall = (outcome.get("extra") or {}).get(key), run.values.get(metric)
        if isinstance(cpu, int | float) and wall:
            found.append((wall, float(cpu)))
    return found


def cpu_waiting(measurer: Measurer, previous: str, revision: str, configs: list[str],
                metric: str) -> str | None:
    """How the engine waited for its CPUs at ``revision``: in every config of ``configs``
    with CPU figures on both sides, the median wall time grew from ``previous`` and the median
    CPU time by less than its square root (less than half of the step, on a log scale, is the
    engine's own work); None when one config's did not, or none has the figures."""
    parts = []
    for config in configs:
        before = timed(measurer, previous, config, metric)
        after = timed(measurer, revision, config, metric)
        if not before or not after:
            continue
        wall, cpu = (statistics.median(a[i] for a in after)
                     / statistics.median(b[i] for b in before) for i in (0, 1))
        if wall <= 1 or cpu * cpu >= wall:
            return None
        parts.append(f"{config}: {wall:.2f}x the wall time, {cpu:.2f}x the CPU time")
    if not parts:
        return None
    return (f"the step is in the wall time of {metric}, not in the engine's CPU time over it "
            f"({'; '.join(parts)} at {revision[:12]} against {previous[:12]}): the engine "
            "waited for its CPUs, which another process occupied")


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
