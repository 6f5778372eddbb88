"""`benchfarm status [EXPERIMENT]`: what the store holds, per experiment or for one in detail."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from db.records import RUN_STATUSES
from harness.commands.arguments import add_paging, job_ref, page_note
from harness.commands.context import store_of
from harness.commands.table import format_table

if TYPE_CHECKING:
    from db.queries import ExperimentSummary
    from db.store import Store


FAILED = "FAILED"  # the list's baseline column, for an experiment whose baseline fails


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="runs per status for every experiment, or one experiment's summary")
    parser.add_argument("experiment", nargs="?", metavar="EXPERIMENT|JOB", type=job_ref,
                        help="experiment name or job id (default: all, briefly)")
    add_paging(parser, "experiments", 100)
    parser.set_defaults(func=run)


def render_summary(summary: ExperimentSummary) -> str:
    """One experiment: counts, per-device counts, and medians per (command, policy, k, device);
    led by a warning when exact attention fails its own workload (``reports.baseline``)."""
    from reports.baseline import baseline_warning, cells_of_groups

    counts = ", ".join(f"{summary.counts[s]} {s}" for s in RUN_STATUSES)
    warning = baseline_warning(cells_of_groups(summary.groups))
    parts = [*([warning, ""] if warning else []),
        f"experiment {summary.name} (spec {summary.spec_hash[:12]}, last run "
        f"{summary.updated_at:%Y-%m-%d %H:%M:%S} UTC): {summary.total} runs: {counts}",
        "",
        format_table(["device", *RUN_STATUSES],
                     [[dev, *(c[s] for s in RUN_STATUSES)] for dev, c in summary.devices.items()]),
    ]
    if summary.groups:
        parts += ["", "ok runs per command, policy, k, device and engine revision, POOLING their "
                      "context lengths and depths (medians; recall is the mean; `benchfarm "
                      "report` keeps them apart):", format_table(
            ["command", "policy", "k", "device", "revision", "runs", "decode ms/tok",
             "attn ms/tok", "overhead ms", "recall", "ppl"],
            [[g.command, g.policy, g.k, g.device, (g.revision or "-")[:12], g.runs,
              g.decode_ms_per_token,
              g.attn_ms_per_token, g.overhead_ms, g.recall, g.ppl] for g in summary.groups],
        )]
    return "\n".join(parts)


def render_progress(store: Store, name: str, job_id: int | None = None) -> str:
    """The job (default: the experiment's newest), and its matrix per board (or class pool):
    the runs it was given, those of them it stored per status (its latest attempt; an earlier
    job's runs are that job's), and those not started yet."""
    job = store.jobs.latest(name) if job_id is None else store.jobs.get(job_id)
    if job is None:
        return ""
    parts = [f"job {job.id}: {job.state} (owner {job.owner}, priority {job.priority}"
             + (f", coordinator {job.holder}" if job.state == "running" else "") + ")"]
    rows = store.jobs.progress(name, job)
    if rows:
        parts += ["", "its matrix per board: the runs it was given, those it stored per "
                      "status and those not started yet:",
                  format_table(["board", "matrix", *RUN_STATUSES, "not started"],
                               [row.line(RUN_STATUSES) for row in rows])]
    return "\n".join(parts)


def not_started(store: Store) -> dict[str, int]:
    """Per experiment with a queued or running job: the runs of its matrix not stored yet
    (the same figure `status JOB` shows, per board)."""
    from db.jobs import ACTIVE

    return {job.experiment: sum(row.not_started for row in store.jobs.progress(job.experiment,
                                                                               job))
            for job in store.jobs.list(ACTIVE)}


def run(args: argparse.Namespace) -> int:
    from reports.baseline import listed_failures

    with store_of(args, create=False, read_only=True) as store:
        if args.experiment:
            job_id = int(args.experiment) if args.experiment.isdigit() else None
            name = args.experiment if job_id is None else store.jobs.get(job_id).experiment
            summary = store.experiment_summary(name)
            progress = render_progress(store, name, job_id)
            print(render_summary(summary) + (f"\n\n{progress}" if progress else ""))
            return 0
        lines = store.experiment_lines(args.limit or None, args.offset)
        total = store.count_experiments()
        waiting = not_started(store)
        failed = {name for name, found in listed_failures(store, lines).items() if found}
    if not total:
        print("no experiments stored yet; run `benchfarm run SPEC` or `benchfarm demo`")
        return 0
    print(format_table(
        ["experiment", "runs", *RUN_STATUSES, "not started", "last run (UTC)", "baseline"],
        [[line.name, line.total, *(line.counts[st] for st in RUN_STATUSES),
          waiting.get(line.name), f"{line.updated_at:%Y-%m-%d %H:%M:%S}",
          FAILED if line.name in failed else None] for line in lines],
    ))
    note = page_note(len(lines), args.offset, total, "experiments")
    if note:
        print(note)
    if failed:
        print(f"{FAILED}: exact attention, the baseline, fails its own workload (recall 0 or "
              "an absurd perplexity); `benchfarm status EXPERIMENT` says where, and no "
              "comparison against it holds")
    return 0
