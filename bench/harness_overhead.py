"""Harness overhead per run, and the speedup of two boards over one, on the local farm.

Runs a 50-run needle matrix (short prompts, few new tokens: the engine's own time is small, so
the harness's cost shows) through the real path: Ray, one DeviceRunner per board, SSH to farm
nodes, pushes into the device cache, fingerprints before and after, the SQLite store.

- overhead per run = wall time of the run as the board's actor saw it minus the engine process
  (pushes, fingerprints, SSH round trips), from the stored ``overhead_ms``;
- matrix wall time / runs: with one board, the difference to the engine time is everything
  the coordinator adds per run (also the driver's result handling, store writes, scheduling);
- speedup = matrix wall time on one board / on a pool of two boards (both x86 nodes of the farm,
  one engine thread each, each pinned to a core of its own unless --no-pin; on a 2-core machine
  the ceiling is 2, and the driver, Ray and both sshd share those two cores with the engines).

The matrix wall time is the span from the first stored run's start to the last one's end; both
boards' caches are primed first (an untimed pass of the same matrix), so neither timing holds a
first push.

    nice .venv/bin/python bench/harness_overhead.py [--runs-per-cell 1] [--keep DIR] [--model DIR]
        [--ctx 1024] [--max-new 16] [--no-pin]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from db.store import Store  # noqa: E402
from devices.farm import farm_down, farm_up  # noqa: E402
from devices.inventory import Device, device_table, load_inventory  # noqa: E402
from harness.execution.cluster import ray_session  # noqa: E402
from harness.execution.coordinator import RunRequest, run_experiment  # noqa: E402
from harness.spec import load_spec  # noqa: E402

MODEL = REPO / "models" / "needle-tiny"
SPEC = """
name = "overhead-{name}"
model = "{model}"
devices = ["{devices}"]
warmups = 1
repeats = {repeats}

[engine]
threads = 1

[engine.policy.exact]

[engine.policy.sparse]
k = [1, 4, 8, 16]

[[workload]]
kind = "needle"
ctx = {ctx}
depth = [0.0, 0.25, 0.5, 0.75, 1.0]
seed = [0, 1]
max_new = {max_new}
"""


def board_entry(name: str, node: Device, workdir: str, cpu: int | None) -> str:
    fields = {"name": name, "host": node.host, "port": node.port, "user": node.user,
              "key": str(node.key), "known_hosts": str(node.known_hosts), "arch": "x86_64",
              "class": "x86", "workdir": workdir, "threads": 1}
    if cpu is not None:
        fields["cpus"] = [cpu]
    return device_table(fields)


def pool_inventory(farm_inventory: Path, out: Path, pin: bool) -> Path:
    """Two x86 boards in class "x86": the farm's two sshd nodes, both run without the emulator.
    One board = farm-x86 by name; two boards = class x86. With ``pin`` each board owns one core
    (taskset), as a real board owns its own CPUs: otherwise the two "boards" of this one host
    preempt each other and the bench measures the host, not the harness."""
    farm = load_inventory(farm_inventory).devices
    x86, arm = farm["farm-x86"], farm["farm-arm"]
    cores = (0, 1) if pin and (os.cpu_count() or 1) >= 2 else (None, None)
    text = (board_entry("farm-x86", x86, x86.workdir, cores[0])
            + board_entry("farm-x86b", arm, f"{arm.workdir}-x86", cores[1]))
    path = out / "bench-inventory.toml"
    path.write_text(text)
    return path


def measure(folder: Path, inventory: Path, devices: str, args: argparse.Namespace,
            name: str | None = None) -> dict[str, float]:
    name = name or devices
    spec_path = folder / f"{name}.toml"
    spec_path.write_text(SPEC.format(name=name, devices=devices, model=args.model,
                                     repeats=args.runs_per_cell, ctx=args.ctx,
                                     max_new=args.max_new))
    spec = load_spec(spec_path)
    with Store.open(f"sqlite:///{folder}/{name}.db") as store:
        started = time.perf_counter()
        summary = run_experiment(RunRequest(spec, load_inventory(inventory), [devices]), store)
        total = time.perf_counter() - started
        runs = store.frames(spec.name)["runs"]
    ok = runs[runs["status"] == "ok"]
    span = (ok["finished_at"].max() - ok["started_at"].min()).total_seconds()
    n = len(ok)
    return {
        "runs": n, "failed": summary.counts["failed"], "command_s": total, "matrix_s": span,
        "engine_ms": statistics.median(ok["engine_ms"]),
        "overhead_ms": statistics.median(ok["overhead_ms"]),
        "per_run_ms": span * 1000 / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-cell", type=int, default=1,
                        help="repeats of the 50-cell matrix (default 1: 50 runs)")
    parser.add_argument("--keep", type=Path, help="keep the farm state and databases here")
    parser.add_argument("--model", type=Path, default=MODEL, help="default: %(default)s")
    # ~45 ms runs of needle-tiny: short, yet the engine is most of a run, as on a board
    parser.add_argument("--ctx", type=int, default=1024, help="prompt tokens (default 1024)")
    parser.add_argument("--max-new", type=int, default=16, help="new tokens (default 16)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not give each board its own core (both float over all CPUs)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="benchfarm-overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "farm"
    inventory = pool_inventory(farm_up(state, with_caller=True), folder, pin=not args.no_pin)
    try:
        with ray_session(None):
            # Both boards' device caches hold the binary and model before either timing: the
            # first push to a board is a one-off, and it would land inside one measurement only
            measure(folder, inventory, "x86", args, name="prime")
            one = measure(folder, inventory, "farm-x86", args)
            two = measure(folder, inventory, "x86", args)
    finally:
        farm_down(state)
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    for label, m in (("1 board ", one), ("2 boards", two)):
        print(f"{label}: {m['runs']} runs ok ({m['failed']} failed), matrix {m['matrix_s']:.1f}s "
              f"(command {m['command_s']:.1f}s incl. Ray start + plan); engine median "
              f"{m['engine_ms']:.0f} ms/run; overhead median {m['overhead_ms']:.0f} ms/run "
              f"(pushes + 2 fingerprints + SSH); matrix wall / runs {m['per_run_ms']:.0f} ms")
    print(f"speedup of 2 boards over 1: {one['matrix_s'] / two['matrix_s']:.2f}x")


if __name__ == "__main__":
    main()
