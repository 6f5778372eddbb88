"""`benchfarm serve`: a long-running coordinator that runs the queued jobs, best first.

It claims the queued job of highest priority whose boards take work now (harness.execution.
serving), checks the job's boards' health when due (before a board's first job, then every
``--health-interval``), runs it like `benchfarm run` (same board leases, so it shares boards
with other coordinators of the store), stores the outcome on the job and takes the next. Board
states and reservations are read from the store as it goes: `benchfarm devices state` takes
effect without a restart. Ctrl-C or SIGTERM stores the in-flight runs as interrupted and puts
the job back in the queue; a serve that was killed outright loses its job's heartbeat, and the
next serve claims the job again after one lease time. Either way the runs already stored as ok
are skipped: nothing is lost, nothing runs twice. A serve runs each job as its owner's (the
owner `submit` recorded); the one who starts it is recorded with its coordinator id (the
caller's identity, harness.access), which its health checks and board changes name.
"""

from __future__ import annotations

import argparse
import time

from harness.commands.arguments import (
    INVENTORY_HELP,
    add_inventory,
    add_lease_ttl,
    add_notify,
    add_ray_address,
    positive_seconds,
    run_count,
)
from harness.commands.context import caller_of, inventory_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run queued jobs (`benchfarm submit`) as they come, until stopped")
    add_inventory(parser, INVENTORY_HELP)
    add_ray_address(parser)
    add_lease_ttl(parser)
    parser.add_argument("--poll", type=positive_seconds, default=2.0,
                        help="seconds between looks at an empty queue (default %(default)s)")
    parser.add_argument("--until-idle", action="store_true",
                        help="stop once no queued job can start instead of waiting for more")
    parser.add_argument("--health-interval", type=positive_seconds, default=3600.0,
                        help="seconds between health checks of a board (before a job, or "
                             "while idle); the first is before its first job (default "
                             "%(default)s)")
    parser.add_argument("--no-health-checks", action="store_true",
                        help="schedule no health checks")
    parser.add_argument("--bad-after", type=run_count,
                        help="runs lost in a row that make a board bad (default: "
                             "$BENCHFARM_BAD_AFTER or 3)")
    add_notify(parser, "also announce every job's end and every board going bad here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.lab.stamped import stamped_output

    with stamped_output():  # a service's log: every line says when (UTC)
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    from harness.execution.cluster import ray_session
    from harness.execution.coordinator import Coordinator, inventory_resources
    from harness.execution.leases import lease_ttl
    from harness.execution.notify import targets_from
    from harness.lab.health import HealthSchedule
    from harness.lab.serving import Service

    who = Coordinator(ttl_s=lease_ttl(args.lease_ttl))
    inventory = inventory_of(args)
    targets = targets_from(args.notify)
    with store_of(args) as store:
        caller = caller_of(store)  # before Ray starts: a serve needs a user once there are some
        store.audit.record(caller.event("serve", who.holder))
    with store_of(args) as store, \
            ray_session(args.ray_address, inventory_resources(inventory)):
        health = None if args.no_health_checks else HealthSchedule(
            store, who.holder, targets, args.health_interval)
        service = Service(store, inventory, who, targets, health, args.bad_after)
        print(f"serving the queue of {store.database.url.render_as_string(hide_password=True)} "
              f"as {who.holder}", flush=True)
        while True:
            job = service.claim()
            if job is None:
                if args.until_idle:
                    waiting = store.jobs.count(("queued",))
                    print("queue empty; stopping (--until-idle)" if not waiting else
                          f"{waiting} queued job(s) wait for their boards (`benchfarm queue` "
                          "says why); stopping (--until-idle)")
                    return 0
                if health is not None:
                    health.while_idle()
                time.sleep(args.poll)
                continue
            print(f"job {job.id}: experiment {job.experiment} (priority {job.priority}, owner "
                  f"{job.owner})", flush=True)
            print(service.serve(job), flush=True)
