"""Per-run overhead of the device path on the local farm.

For each node, REPEATS times: open an SSH connection, push the engine (already cached: the
device hashes it, nothing is sent), run `lmc info`, close. Prints the median of each phase, the
same push + run on a connection that stays open, what a DeviceRunner actor pays per run once
its artifacts are pushed (a fingerprint, the run, a fingerprint: the coordinator pushes each
artifact once per connection), the same as one remote command (``probed_run``), one
fingerprint alone, and `lmc info` run directly here as the baseline the overhead is measured
against.

    .venv/bin/python bench/farm_overhead.py [--repeats 15] [--inventory FILE]

Without --inventory a temporary farm is started and stopped.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from devices.cache import ArtifactCache
from devices.connect import connect
from devices.farm import QEMU_AARCH64, farm_down, farm_up
from devices.fingerprint import probe, probed_run
from devices.inventory import Device, load_inventory
from harness.engines import adapter_of
from harness.engines.lmc import NAME as LMC
from harness.engines.lmc.build import build_engine

LMC_INFO = adapter_of(LMC).health_argv  # `lmc info`, as the adapter runs it


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.1f}"


def measure_node(device: Device, binary: Path, repeats: int) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {"connect": [], "push": [], "run": [], "close": [],
                                      "cold total": [], "warm push+run": [], "probe": [],
                                      "probe+run+probe": [], "probed_run": []}
    with connect(device) as t:
        c = ArtifactCache(t)
        c.push(binary)  # make sure it is cached before timing
    for _ in range(repeats):
        t0 = time.perf_counter()
        t = connect(device)
        c = ArtifactCache(t)  # a new connection knows nothing of the cache yet
        t1 = time.perf_counter()
        remote = c.push(binary)
        assert c.last_push.bytes_sent == 0, "the engine should already be cached"
        t2 = time.perf_counter()
        result = t.run(LMC_INFO(remote), timeout=60)
        t3 = time.perf_counter()
        t.close()
        t4 = time.perf_counter()
        assert result.ok, result.stderr
        for name, value in (("connect", t1 - t0), ("push", t2 - t1), ("run", t3 - t2),
                            ("close", t4 - t3), ("cold total", t4 - t0)):
            phases[name].append(value)
    with connect(device) as t:
        c = ArtifactCache(t)
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = t.run(LMC_INFO(c.push(binary)), timeout=60)
            phases["warm push+run"].append(time.perf_counter() - t0)
            assert result.ok, result.stderr
        remote = c.push(binary)
        for _ in range(repeats):
            t0 = time.perf_counter()
            probe(t)
            t1 = time.perf_counter()
            result = t.run(LMC_INFO(remote), timeout=60)
            probe(t)
            t2 = time.perf_counter()
            assert result.ok, result.stderr
            phases["probe"].append(t1 - t0)
            phases["probe+run+probe"].append(t2 - t0)
            t3 = time.perf_counter()
            probed = probed_run(t, LMC_INFO(remote), timeout=60, cache=c)
            phases["probed_run"].append(time.perf_counter() - t3)
            assert probed.result.ok, probed.result.stderr
    return phases


def baseline(argv: list[str], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--inventory", type=Path, help="a running farm's inventory")
    args = parser.parse_args()

    binaries = {arch: Path(build_engine(target=arch).binary) for arch in ("x86_64", "aarch64")}
    state = None
    inventory_path = args.inventory
    if inventory_path is None:
        state = Path(tempfile.mkdtemp(prefix="farm-overhead-"))
        inventory_path = farm_up(state, with_caller=True)  # ends with this bench
    try:
        inventory = load_inventory(inventory_path)
        print(f"medians over {args.repeats} repeats, milliseconds")
        print(f"{'node':<10} {'connect':>8} {'push':>8} {'run':>8} {'close':>8} "
              f"{'cold':>8} {'warm':>8} {'probe':>8} {'p+run+p':>8} {'probed':>8} {'direct':>8}")
        for name in ("farm-x86", "farm-arm"):
            device = inventory.get(name)
            binary = binaries[device.arch]
            phases = measure_node(device, binary, args.repeats)
            prefix = QEMU_AARCH64 if device.emulated else []
            direct = baseline([*prefix, *LMC_INFO(str(binary))],
                              args.repeats)
            print(f"{name:<10} {ms(phases['connect'])} {ms(phases['push'])} {ms(phases['run'])} "
                  f"{ms(phases['close'])} {ms(phases['cold total'])} "
                  f"{ms(phases['warm push+run'])} {ms(phases['probe'])} "
                  f"{ms(phases['probe+run+probe'])} {ms(phases['probed_run'])} {ms(direct)}")
        print("cold = connect + cached push + run + close; warm = cached push + run on an open "
              "connection; probe = one fingerprint; p+run+p = fingerprint, run, fingerprint on "
              "an open connection; probed = the same as one command (probed_run); direct = `lmc "
              "info` run here without SSH")
        print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    finally:
        if state is not None:
            farm_down(state)
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
