"""What sharing boards costs per run: the store's lease round trips and the board's lock file.

Per run the scheduler (harness.execution.turns) takes the board's lease, checks that no other
coordinator finished the run meanwhile, and releases the lease once the result is stored; the
leases in flight and the job's heartbeat are renewed at most once a second, whatever the
number of runs. On the board, the run's command is wrapped in ``flock -n`` on the workdir's
lock file. This script times both, alternating with and without, and prints medians:

* store: ROUNDS rounds of RUNS x (acquire, completed_run_keys, release) on each ``--db`` (a
  temporary SQLite file by default), plus one renew + heartbeat for comparison;
* board: REPEATS x ``probed_run(true)`` with and without the lock, on the local device and on
  ``--device NAME`` of ``--inventory FILE`` (e.g. a farm node over SSH).

    .venv/bin/python bench/lease_overhead.py [--db URL ...] [--rounds 5] [--runs 200]
        [--repeats 30] [--inventory FILE --device NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

from db.store import Store
from devices.connect import connect
from devices.fingerprint import probed_run
from devices.inventory import Device, load_inventory, local_device


def per_run_ms(samples: list[float], runs: int) -> str:
    return f"{statistics.median(samples) / runs * 1000:7.3f}"


def bench_store(url: str, rounds: int, runs: int) -> None:
    with Store.open(url) as store:
        job = store.jobs.add("bench", "bench.toml", "", owner="bench", holder="bench")
        keys = [f"bench-key-{i}" for i in range(runs)]
        lease_rounds, renew_rounds = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            for key in keys:
                claim = store.leases.acquire("bench-board", "bench", 30, "bench", key)
                assert claim.granted is not None
                store.completed_run_keys([key])
                store.leases.release(claim.granted.lease_id)
            lease_rounds.append(time.perf_counter() - started)
            held = store.leases.acquire("bench-board", "bench", 30).granted
            started = time.perf_counter()
            for _ in range(runs):
                store.leases.renew([held.lease_id], 30)
                store.jobs.heartbeat(job)
            renew_rounds.append(time.perf_counter() - started)
            store.leases.release(held.lease_id)
        shown = store.engine.url.render_as_string(hide_password=True)
    print(f"store {shown}: per run (acquire + done check + release) "
          f"{per_run_ms(lease_rounds, runs)} ms; one renew + job heartbeat "
          f"{per_run_ms(renew_rounds, runs)} ms (at most once a second)  "
          f"[{rounds} rounds of {runs}]")


def bench_board(device: Device, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        if device.is_local:
            device = dataclasses.replace(device, workdir=workdir)
        times: dict[bool, list[float]] = {False: [], True: []}
        with connect(device) as transport:
            probed_run(transport, ["true"], timeout=30, lock=True)  # static facts, workdir
            for _ in range(repeats):
                for lock in (False, True):
                    started = time.perf_counter()
                    result = probed_run(transport, ["true"], timeout=30, lock=lock).result
                    times[lock].append(time.perf_counter() - started)
                    assert result.exit_code == 0, result.stderr
    plain, locked = (statistics.median(times[k]) * 1000 for k in (False, True))
    print(f"board {device.name}: probed_run(true) {plain:7.2f} ms, under the lock file "
          f"{locked:7.2f} ms: +{locked - plain:5.2f} ms per run  [{repeats} each, alternating]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", help="store URL (repeatable; default: a "
                        "temporary SQLite file)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--inventory", help="inventory with --device")
    parser.add_argument("--device", help="a device of --inventory to time the lock file on")
    args = parser.parse_args()
    if min(args.rounds, args.runs, args.repeats) < 1:
        parser.error("--rounds, --runs and --repeats must be at least 1")
    if bool(args.inventory) != bool(args.device):
        parser.error("--inventory and --device go together")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as folder:
        for url in args.db or [f"sqlite:///{Path(folder) / 'bench.db'}"]:
            bench_store(url, args.rounds, args.runs)
    bench_board(local_device(), args.repeats)
    if args.device:
        bench_board(load_inventory(args.inventory).get(args.device), args.repeats)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
