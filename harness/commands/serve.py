"""`benchfarm serve`: a long-running coordinator that runs the queued jobs, best first.

It claims the queued job of highest priority, runs it like `benchfarm run` (same board leases,
so it shares boards with other coordinators of the store), stores the outcome on the job and
takes the next. Ctrl-C or SIGTERM stores the in-flight runs as interrupted and puts the job
back in the queue; a serve that was killed outright loses its job's heartbeat, and the next
serve claims the job again after one lease time. Either way the runs already stored as ok are
skipped: nothing is lost, nothing runs twice.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from db.jobs import JobInfo
from db.store import Store
from devices.inventory import Inventory, load_inventory
from harness.commands.flags import (
    INVENTORY_HELP,
    add_inventory,
    add_lease_ttl,
    add_ray_address,
    positive_seconds,
)
from harness.execution.cluster import ray_session
from harness.execution.coordinator import (
    Coordinator,
    RunRequest,
    inventory_resources,
    run_experiment,
)
from harness.execution.sharing import lease_ttl
from harness.spec import parse_spec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run queued jobs (`benchfarm submit`) as they come, until stopped")
    add_inventory(parser, INVENTORY_HELP)
    add_ray_address(parser)
    add_lease_ttl(parser)
    parser.add_argument("--poll", type=positive_seconds, default=2.0,
                        help="seconds between looks at an empty queue (default %(default)s)")
    parser.add_argument("--until-idle", action="store_true",
                        help="stop once the queue is empty instead of waiting for more")
    parser.set_defaults(func=run)


def serve_job(job: JobInfo, inventory: Inventory, store: Store, who: Coordinator) -> str:
    """Run one claimed job to its end; returns the line to print. Interrupts requeue it."""
    try:
        spec = parse_spec(job.spec_text, Path(job.spec_path))
        summary = run_experiment(RunRequest(spec, inventory, job.devices, job.force,
                                            coordinator=who, job_id=job.id), store)
    except KeyboardInterrupt:
        store.jobs.requeue(job.id, "requeued: its coordinator was stopped (Ctrl-C/SIGTERM)")
        raise
    except Exception as exc:  # noqa: BLE001 - a job's error ends the job, not the service
        if getattr(type(exc), "exit_code", None) is None:
            raise
        store.jobs.finish(job.id, "failed", str(exc))
        return f"job {job.id} ({job.experiment}) failed: {exc}"
    state = "cancelled" if summary.cancelled else "done" if summary.succeeded else "failed"
    store.jobs.finish(job.id, state, summary.line())
    return f"job {job.id} {state}: {summary.line()}"


def run(args: argparse.Namespace) -> int:
    who = Coordinator(ttl_s=lease_ttl(args.lease_ttl))
    inventory = load_inventory(args.inventory)
    with Store.open(args.db) as store, \
            ray_session(args.ray_address, inventory_resources(inventory)):
        print(f"serving the queue of {store.engine.url.render_as_string(hide_password=True)} "
              f"as {who.holder}", flush=True)
        while True:
            job = store.jobs.claim_next(who.holder, stale_after_s=who.ttl_s)
            if job is None:
                if args.until_idle:
                    print("queue empty; stopping (--until-idle)")
                    return 0
                time.sleep(args.poll)
                continue
            print(f"job {job.id}: experiment {job.experiment} (priority {job.priority}, owner "
                  f"{job.owner})", flush=True)
            print(serve_job(job, inventory, store, who), flush=True)
