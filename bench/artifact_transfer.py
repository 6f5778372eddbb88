"""How long an artifact takes to reach a node's cache, on a real two-node Ray cluster.

Starts the test suite's two-node cluster (head + a worker node in its own mount namespace that
cannot see the work tree; see tests/fixtures_cluster.py), joins it as the driver, and serves
files of several sizes (random bytes) and the shipped needle model through the same
``ArtifactServer`` a run uses. A task on each node materialises the artifact in an empty
node cache (``NodeCache``: chunked fetch through Ray's object store, sha256 verified, renamed
into place) and reports the time. The head node is the driver's node (the same-node figure);
the worker node is the second node. A plain local file copy of the same file is timed beside
them for scale. Medians of --repeats fetches, each into a fresh cache.

    nice .venv/bin/python bench/artifact_transfer.py [--sizes-mb 16,128,512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

# Ray reads its authentication settings once, on import: this driver's token comes first.
TOKEN = secrets.token_hex(32)
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})

import ray  # noqa: E402
from fixtures_cluster import start_cluster  # noqa: E402

from devices.cache import local_sha256  # noqa: E402
from harness.execution.artifacts import NodeCache, start_server  # noqa: E402
from harness.execution.cluster import code_for_workers  # noqa: E402
from harness.identity import Catalogue  # noqa: E402

MODEL = REPO / "models" / "needle-tiny"


@ray.remote(num_cpus=0)
def fetch_into_fresh_cache(server: object, sha256: str, tree: bool, in_flight: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="bf-bench-cache-"))
    try:
        cache = NodeCache(server, root, in_flight)
        start = time.perf_counter()
        cache.tree(sha256, "bench") if tree else cache.blob(sha256, "bench")
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers: {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=positive_ints, default=[16, 128, 512])
    parser.add_argument("--repeats", type=lambda t: positive_ints(t)[0], default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bf-bench-"))
    cluster = start_cluster(work, [], TOKEN)
    try:
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=code_for_workers())
        catalogue = Catalogue.empty()
        items: list[tuple[str, str, bool, int, Path | None]] = []
        for mb in args.sizes_mb:
            path = work / f"random-{mb}mb.bin"
            with path.open("wb") as f:
                for _ in range(mb):
                    f.write(os.urandom(1 << 20))
            items.append((f"{mb} MiB file", catalogue.add_file(path, local_sha256(path)), False,
                          mb << 20, path))
        model_bytes = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
        items.append((f"needle-tiny model ({len(list(MODEL.iterdir()))} files)",
                      catalogue.add_tree(MODEL), True, model_bytes, None))
        server = start_server(catalogue, "bench")
        load = os.getloadavg()[0]
        print(f"load average at start: {load:.2f}; {args.repeats} fetches each, medians")
        print(f"{'artifact':34} {'in flight':>9} {'same node ms':>13} {'second node ms':>15} "
              f"{'MB/s (2nd)':>11} {'local copy ms':>14}")
        cases = [(node, window) for window in (1, 2) for node in ("node_head", "node_worker")]
        for label, sha, tree, size, path in items:
            times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
            copies: list[float] = []
            for _ in range(args.repeats):
                for (node, window), runs in times.items():  # alternate: all see the same load
                    task = fetch_into_fresh_cache.options(resources={node: 0.01})
                    runs.append(ray.get(task.remote(server, sha, tree, window)))
                if path is not None:
                    start = time.perf_counter()
                    shutil.copyfile(path, work / "copy.bin")
                    copies.append(time.perf_counter() - start)
            copy = f"{statistics.median(copies) * 1000:14.1f}" if copies else f"{'-':>14}"
            for window in (1, 2):
                head = statistics.median(times[("node_head", window)]) * 1000
                worker = statistics.median(times[("node_worker", window)]) * 1000
                print(f"{label:34} {window:9d} {head:13.1f} {worker:15.1f} "
                      f"{size / worker / 1000:11.1f} {copy}")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
