"""Measure the result store's bulk insert of token timings (rows/s), as save_run does it.

    .venv/bin/python bench/store.py [--rows 1000000] [--per-run 1000] [--repeats 5] [--db URL]

Each repeat saves rows/per-run runs (each with per-run token timings, one transaction per run)
into a fresh SQLite file (or the given URL, emptied first) and reports the token-timing rows per
second over the whole repeat. Prints the median, min and max over the repeats, and the rows per
CPU second (robust to other load on the machine) and how fast frames() reads the rows back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import delete  # noqa: E402

from db import RunResult, Store, TokenTiming  # noqa: E402
from db.models import Run  # noqa: E402


def make_results(store: Store, runs: int, per_run: int, tag: str) -> list[RunResult]:
    exp = store.upsert_experiment(f"bench-{tag}", "bench", "0")
    dev = store.upsert_device("bench", "x86_64", "x86", False, {})
    timings = [TokenTiming(step=i, token=1000 + i, ms=12.5 + i * 1e-3, attn_ms=3.25)
               for i in range(per_run)]
    return [RunResult(run_key=f"{tag}-{n}", experiment_id=exp, device_id=dev, command="generate",
                      token_timings=timings) for n in range(runs)]


def one_repeat(url: str | None, runs: int, per_run: int,
               tag: str) -> tuple[float, float, float]:
    """Rows per wall second and per CPU second of saving, and rows per second of frames()."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(url or f"sqlite:///{tmp}/bench.db")
        try:
            with store.database.begin() as conn:
                conn.execute(delete(Run.__table__).where(Run.run_key.like("bench-%")))
            results = make_results(store, runs, per_run, tag)
            start, cpu_start = time.perf_counter(), time.process_time()
            for result in results:
                store.save_run(result)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
            start = time.perf_counter()
            store.frames(f"bench-{tag}")
            read = time.perf_counter() - start
        finally:
            store.close()
    return runs * per_run / elapsed, runs * per_run / cpu, runs * per_run / read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--per-run", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", help="SQLAlchemy URL (default: a fresh SQLite file per repeat)")
    args = parser.parse_args()
    runs = max(1, args.rows // args.per_run)
    measured = [one_repeat(args.db, runs, args.per_run, f"r{i}") for i in range(args.repeats)]
    rates = [wall for wall, _, _ in measured]
    cpu_rates = [cpu for _, cpu, _ in measured]
    read_rates = [read for _, _, read in measured]
    print(f"store bulk insert: {runs} runs x {args.per_run} token timings = "
          f"{runs * args.per_run} rows per repeat, {args.repeats} repeats, "
          f"db={args.db or 'sqlite (fresh file, WAL)'}")
    print(f"rows/s median {statistics.median(rates):,.0f}  min {min(rates):,.0f}  "
          f"max {max(rates):,.0f}")
    # On a loaded machine wall time includes waiting for a core; CPU time does not (but it
    # leaves out the database server's own work when the database is not SQLite).
    print(f"rows per CPU second of this process: median {statistics.median(cpu_rates):,.0f}")
    print(f"frames(experiment) read-back: median {statistics.median(read_rates):,.0f} "
          "token-timing rows/s")


if __name__ == "__main__":
    main()
