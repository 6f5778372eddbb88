"""How long `benchfarm` takes to start, beside a bare `python -c pass` on the same machine.

Each round runs every command once, in the same order, alternating the baseline with the CLI
calls, so that a change of load hits all of them alike; the figures are medians over the
rounds, with the load average before and after. The store commands (`queue`, `status`,
`devices list`) read a fresh SQLite store in a scratch folder (created once, before the
rounds: the timed calls open an existing store, as on a lab machine). Beside the wall time,
the CPU time (user + system) each call took: on a busy machine the wall time is mostly
waiting for a core, the CPU time is what the call itself costs. The read commands `queue` and
`status` should stay under 0.5 s of CPU above the bare python start (column "+ cpu s", the
difference of the medians; "target" says whether they do).

The calls run with their modules' bytecode cached, as an installed benchfarm runs: in a
scratch folder (PYTHONPYCACHEPREFIX; the checkout is not written to), filled by one untimed
call of each command before the rounds. An environment that sets PYTHONDONTWRITEBYTECODE
would otherwise have every call compile benchfarm's own modules from source (0.02-0.03 s
more CPU per `queue` or `status` on the 2-core Xeon, 2026-12-05).

    nice .venv/bin/python bench/cli_startup.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "harness.cli"]
READ_TARGET_S = 0.5  # queue and status: at most this much CPU above a bare python start
READ_TARGETS = ("benchfarm queue", "benchfarm status")
HELPS = ["build", "devices", "run", "submit", "serve", "queue", "status", "report", "gc"]


def commands(db: str) -> dict[str, list[str]]:
    timed = {"python -c pass": [sys.executable, "-c", "pass"],
             "benchfarm --help": [*CLI, "--help"]}
    timed |= {f"benchfarm {name} --help": [*CLI, name, "--help"] for name in HELPS}
    timed |= {f"benchfarm {' '.join(a)}": [*CLI, "--db", db, *a]
              for a in (["queue"], ["status"], ["devices", "list"])}
    return timed


def timed_call(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call, its bytecode cached under ``cwd``."""
    env = {name: value for name, value in os.environ.items()
           if name != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PYTHONPATH": str(REPO), "PYTHONPYCACHEPREFIX": str(cwd / "pycache")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        db = f"sqlite:///{folder}/bench.db"
        timed = commands(db)
        subprocess.run([sys.executable, "-c", f"from db.store import Store; Store.open({db!r})"],
                       cwd=folder, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        for argv in timed.values():  # untimed: writes the bytecode the rounds read
            timed_call(argv, folder)
        load_before = os.getloadavg()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in timed}
        for _ in range(args.rounds):
            for name, argv in timed.items():
                samples[name].append(timed_call(argv, folder))
        load_after = os.getloadavg()
    base = statistics.median(wall for wall, _ in samples["python -c pass"])
    base_cpu = statistics.median(cpu for _, cpu in samples["python -c pass"])
    print(f"{args.rounds} rounds on {os.cpu_count()} CPUs; load average (1/5/15 min) before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}")
    print(f"{'command':<34} {'median s':>9} {'min s':>6} {'max s':>6} {'x baseline':>11} "
          f"{'+ s':>6} {'cpu s':>7} {'+ cpu s':>7}  target")
    for name, values in samples.items():
        walls = [wall for wall, _ in values]
        median = statistics.median(walls)
        cpu = statistics.median(c for _, c in values)
        target = ""
        if name in READ_TARGETS:
            target = "met" if cpu - base_cpu < READ_TARGET_S else "NOT met"
        print(f"{name:<34} {median:>9.3f} {min(walls):>6.3f} {max(walls):>6.3f} "
              f"{median / base:>11.1f} {median - base:>6.3f} {cpu:>7.3f} "
              f"{cpu - base_cpu:>7.3f}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
