"""Harness overhead per run, and the speedup of two boards over one, on the local farm.

Runs a 50-run needle matrix (short prompts, few new tokens: the engine's own time is small, so
the harness's cost shows) through the real path: Ray, one DeviceRunner per board, SSH to farm
nodes, pushes into the device cache, fingerprints before and after, the SQLite store.

- overhead per run = wall time of the run as the board's actor saw it minus the engine process
  (pushes, fingerprints, SSH round trips), from the stored ``overhead_ms``;
- matrix wall time / runs: with one board, the difference to the engine time is everything
  the coordinator adds per run (also the driver's result handling, store writes, scheduling);
- speedup = matrix wall time on one board / on a pool of two boards (both x86 nodes of the farm,
  one engine thread each; on a 2-core machine the ceiling is 2).

    nice .venv/bin/python bench/harness_overhead.py [--runs-per-cell 1] [--keep DIR] [--model DIR]
        [--ctx 128] [--max-new 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from db.store import Store  # noqa: E402
from devices.farm import farm_down, farm_up  # noqa: E402
from devices.inventory import load_inventory  # noqa: E402
from harness.coordinator import run_experiment  # noqa: E402
from harness.scheduler import ray_session  # noqa: E402
from harness.spec import load_spec  # noqa: E402

MODEL = REPO / "models" / "needle-tiny"
SPEC = """
name = "overhead-{devices}"
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


def pool_inventory(farm_inventory: Path, out: Path) -> Path:
    """The farm plus a second x86 board in class "x86": the farm's other sshd, used without the
    emulator. One board = farm-x86 by name; two boards = class x86."""
    arm = load_inventory(farm_inventory).devices["farm-arm"]
    text = farm_inventory.read_text() + (
        f'\n[[device]]\nname = "farm-x86b"\nhost = "{arm.host}"\nport = {arm.port}\n'
        f'user = "{arm.user}"\nkey = "{arm.key}"\nknown_hosts = "{arm.known_hosts}"\n'
        f'arch = "x86_64"\nclass = "x86"\nworkdir = "{arm.workdir}-x86"\n')
    path = out / "bench-inventory.toml"
    path.write_text(text)
    return path


def measure(folder: Path, inventory: Path, devices: str, args: argparse.Namespace
            ) -> dict[str, float]:
    spec_path = folder / f"{devices}.toml"
    spec_path.write_text(SPEC.format(devices=devices, model=args.model,
                                     repeats=args.runs_per_cell, ctx=args.ctx,
                                     max_new=args.max_new))
    spec = load_spec(spec_path)
    with Store.open(f"sqlite:///{folder}/{devices}.db") as store:
        started = time.perf_counter()
        summary = run_experiment(spec, load_inventory(inventory), store, [devices])
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
    parser.add_argument("--ctx", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--max-new", type=int, default=4, help="new tokens (default 4)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="benchfarm-overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "farm"
    inventory = pool_inventory(farm_up(state), folder)
    try:
        with ray_session(None):
            one = measure(folder, inventory, "farm-x86", args)
            two = measure(folder, inventory, "x86", args)
    finally:
        farm_down(state)
    for label, m in (("1 board ", one), ("2 boards", two)):
        print(f"{label}: {m['runs']} runs ok ({m['failed']} failed), matrix {m['matrix_s']:.1f}s "
              f"(command {m['command_s']:.1f}s incl. Ray start + plan); engine median "
              f"{m['engine_ms']:.0f} ms/run; overhead median {m['overhead_ms']:.0f} ms/run "
              f"(pushes + 2 fingerprints + SSH); matrix wall / runs {m['per_run_ms']:.0f} ms")
    print(f"speedup of 2 boards over 1: {one['matrix_s'] / two['matrix_s']:.2f}x")


if __name__ == "__main__":
    main()
