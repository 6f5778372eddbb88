"""What sharing boards costs per run: the store's lease round trips and the board's lock file.

Per run the scheduler (harness.execution.leases) takes the board's lease, checks that no other
coordinator finished the run meanwhile, and releases the lease once the result is stored; the
leases in flight and the job's heartbeat are renewed at most once a second, whatever the
number of runs. On the board, the run's command is wrapped in ``flock -n`` on the workdir's
lock file. This script times both, alternating with and without, and prints medians:

* store: ROUNDS rounds of RUNS x (acquire, completed_run_keys, release) on each ``--db`` (a
  temporary SQLite file by default), plus one renew + heartbeat for comparison;
* board: REPEATS x ``probed_run(true)`` with and without the lock, on the local device and on
  ``--device NAME`` of ``--inventory FILE`` (e.g. a farm node over SSH);
* hand-over (``--handover ROUNDS``): real coordinators (``run_experiment`` on a private Ray,
  the shipped needle model, the `local` board, no warm-ups) in alternating rounds: one
  coordinator alone with 2 x ``--handover-runs`` runs, then two of equal priority sharing the
  board with ``--handover-runs`` each (they alternate). The board's idle time between two runs
  (the runner's start of one minus its end of the previous) is split into "same coordinator"
  and "hand-over"; medians over all rounds.

    .venv/bin/python bench/lease_overhead.py [--db URL ...] [--rounds 5] [--runs 200]
        [--repeats 30] [--inventory FILE --device NAME] [--handover 3 --handover-runs 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from db.store import Store
from devices.boardlock import LockHolder
from devices.connect import connect
from devices.fingerprint import probed_run
from devices.inventory import Device, Inventory, load_inventory, local_device
from harness import REPO_ROOT
from harness.execution.cluster import ray_session
from harness.execution.coordinator import Coordinator, RunRequest, run_experiment
from harness.spec import load_spec

MODEL = REPO_ROOT / "models" / "needle-tiny"
HOLDER = LockHolder("bench", "bench", None, "bench")


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
        shown = store.database.url.render_as_string(hide_password=True)
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
            probed_run(transport, ["true"], timeout=30, lock=HOLDER)  # static facts, workdir
            for _ in range(repeats):
                for lock in (False, True):
                    started = time.perf_counter()
                    result = probed_run(transport, ["true"], timeout=30,
                                        lock=HOLDER if lock else None).result
                    times[lock].append(time.perf_counter() - started)
                    assert result.exit_code == 0, result.stderr
    plain, locked = (statistics.median(times[k]) * 1000 for k in (False, True))
    print(f"board {device.name}: probed_run(true) {plain:7.2f} ms, under the lock file "
          f"{locked:7.2f} ms: +{locked - plain:5.2f} ms per run  [{repeats} each, alternating]")


def handover_spec(folder: Path, name: str, seed: int, runs: int) -> Path:
    path = folder / f"{name}.toml"
    depths = [round((i + 1) / (runs + 1), 4) for i in range(runs)]
    path.write_text(f'name = "{name}"\nmodel = "{MODEL}"\ndevices = ["local"]\nwarmups = 0\n'
                    '[engine.policy.exact]\n[[workload]]\nkind = "needle"\nctx = 128\n'
                    f'depth = {depths}\nseed = {seed}\nmax_new = 2\n')
    return path


def coordinate(store: Store, spec_path: Path, inventory: Inventory) -> None:
    spec, who = load_spec(spec_path), Coordinator()
    job = store.jobs.add(spec.name, str(spec_path), spec.text, owner="bench", holder=who.holder)
    summary = run_experiment(RunRequest(spec, inventory, stream=io.StringIO(), coordinator=who,
                                        job_id=job), store)
    assert summary.complete and not summary.counts["failed"], summary.line()


def board_gaps(store: Store, names: list[str]) -> tuple[list[float], list[float]]:
    """The board's idle seconds between consecutive runs: (same coordinator, hand-over)."""
    runs = pd.concat([store.frames(name)["runs"] for name in names]).sort_values("started_at")
    same, handover = [], []
    previous = None
    for run in runs.itertuples():
        if previous is not None:
            gap = (run.started_at - previous.finished_at).total_seconds()
            (same if run.experiment_id == previous.experiment_id else handover).append(gap)
        previous = run
    return same, handover


def bench_handover(rounds: int, runs: int) -> None:
    same_alone, same_shared, handovers = [], [], []
    with tempfile.TemporaryDirectory() as folder, ray_session(None):
        base = Path(folder)
        inventory = Inventory({"local": dataclasses.replace(local_device(),
                                                            workdir=str(base / "work"))})
        for i in range(rounds):
            with Store.open(f"sqlite:///{base}/alone-{i}.db") as store:
                coordinate(store, handover_spec(base, f"alone-{i}", 0, 2 * runs), inventory)
                same_alone += board_gaps(store, [f"alone-{i}"])[0]
            url = f"sqlite:///{base}/shared-{i}.db"
            names = [f"shared-{i}-{who}" for who in "ab"]
            stores = [Store.open(url) for _ in names]  # opened here: migrations are not
            # thread-safe
            threads = [threading.Thread(target=coordinate, args=(
                store, handover_spec(base, name, seed, runs), inventory))
                for seed, (store, name) in enumerate(zip(stores, names, strict=True))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            same, handover = board_gaps(stores[0], names)
            same_shared += same
            handovers += handover
            for store in stores:
                store.close()

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):6.3f} s" if values else "     - "

    print(f"hand-over [{rounds} rounds of {2 * runs} runs, alternating alone / shared]: board "
          f"idle between runs of one coordinator alone {median(same_alone)} "
          f"(n={len(same_alone)}), of one coordinator while sharing {median(same_shared)} "
          f"(n={len(same_shared)}), per hand-over between two {median(handovers)} "
          f"(n={len(handovers)}, max {max(handovers, default=0):.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", help="store URL (repeatable; default: a "
                        "temporary SQLite file)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--inventory", help="inventory with --device")
    parser.add_argument("--device", help="a device of --inventory to time the lock file on")
    parser.add_argument("--handover", type=int, default=0, metavar="ROUNDS",
                        help="also time hand-overs between two coordinators (default: not)")
    parser.add_argument("--handover-runs", type=int, default=8,
                        help="runs per coordinator and hand-over round (default 8)")
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
    if args.handover:
        bench_handover(args.handover, args.handover_runs)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
