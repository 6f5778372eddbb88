"""Device fingerprints: the machine facts that decide whether a timing can be trusted.

``probe`` takes one snapshot (one remote command, reading /proc and /sys only, so it works the
same on any board whatever compiler it has). The coordinator takes one before and one after
every run; ``flags(before, after)`` names what should make a reader distrust the numbers.
"""

from __future__ import annotations

import time
from typing import Any

from devices.errors import DeviceError
from devices.transport import Transport

SCHEMA = "benchfarm.fingerprint/1"
PROBE_TIMEOUT_S = 30.0

# A constant script: nothing from the inventory or the user is interpolated into it. It is taken
# before and after every run, so it starts one process (sed, reading /proc/meminfo and
# /proc/cpuinfo) on recent kernels, two on older ones (uname); every other file is read with the
# shell's built-in `read`.
PROBE_SCRIPT = r"""
get() {  # get FILE DEFAULT: sets v to the first line of FILE, or to DEFAULT
  v=
  { read -r v || [ -n "$v" ]; } 2>/dev/null < "$1"
  [ -n "$v" ] || v=$2
}
get /proc/sys/kernel/arch ''; [ -n "$v" ] || v=$(uname -m)  # the file is new (Linux 6.1)
printf 'arch %s\n' "$v"
get /proc/sys/kernel/osrelease ''; printf 'kernel %s\n' "$v"
read -r l1 l5 l15 rest < /proc/loadavg; printf 'loadavg %s %s %s\n' "$l1" "$l5" "$l15"
sed -n -E -e 's/^(MemTotal|MemAvailable):/mem \1/p' \
  -e 's/^(processor|model name|Hardware|CPU part)[[:space:]]*:[[:space:]]*/cpuinfo \1=/p' \
  /proc/meminfo /proc/cpuinfo
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  get "$c/online" 1; line="core ${c##*cpu} $v"
  for name in cpuinfo_max_freq scaling_max_freq scaling_cur_freq scaling_governor; do
    get "$c/cpufreq/$name" -; line="$line $v"
  done
  printf '%s\n' "$line"
done
for z in /sys/class/thermal/thermal_zone*; do
  [ -r "$z/temp" ] || continue
  get "$z/type" '?'; zone_type=$v; get "$z/temp" ''
  printf 'thermal %s %s %s\n' "${z##*/}" "$zone_type" "$v"
done
exit 0
"""

# Thresholds for flags(): chosen to be quiet on a healthy idle board.
HOT_C = 85.0  # RK3588 starts thermal throttling around 85 degC
LOADED_PER_CPU = 0.3  # 1-minute load average per online CPU before the run
LOADED_MIN = 1.0
CAPPED_RATIO = 0.98  # policy max below the hardware max: a thermal or user cap
LOW_MEMORY_RATIO = 0.1


def probe(transport: Transport) -> dict[str, Any]:
    """One fingerprint of the device behind ``transport`` (a JSON-ready dict)."""
    result = transport.run_host(["sh", "-c", PROBE_SCRIPT], timeout=PROBE_TIMEOUT_S)
    if result.exit_code != 0:
        raise DeviceError(transport.device.name, f"probe failed with exit code "
                                                 f"{result.exit_code}: {result.stderr.strip()}")
    facts = parse_probe(result.stdout)
    facts.update(
        schema=SCHEMA,
        device=transport.device.name,
        target_arch=transport.device.arch,
        emulated=transport.device.emulated,
        taken_at=time.time(),
    )
    return facts


def _khz(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_probe(text: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"arch": None, "kernel": None, "loadavg": None, "mem_total_kb": None,
                             "mem_available_kb": None, "cpu_model": None, "cores": [],
                             "thermal": []}
    parts_by_cpu: dict[int, str] = {}
    current_cpu = -1
    models: list[str] = []
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("arch", "kernel"):
            facts[kind] = rest.strip()
        elif kind == "loadavg":
            facts["loadavg"] = [float(x) for x in rest.split()]
        elif kind == "mem":
            key, value = rest.split()[:2]
            facts["mem_total_kb" if key == "MemTotal" else "mem_available_kb"] = int(value)
        elif kind == "cpuinfo":
            key, _, value = rest.partition("=")
            if key == "processor":
                current_cpu = int(value) if value.isdigit() else current_cpu
            elif key == "CPU part":
                parts_by_cpu[current_cpu] = value  # 0xd0b = Cortex-A76, 0xd05 = Cortex-A55
            elif value and value not in models:
                models.append(value)
        elif kind == "core":
            fields = rest.split()
            if len(fields) == 6 and fields[0].isdigit():
                facts["cores"].append({
                    "cpu": int(fields[0]),
                    "online": fields[1] != "0",
                    "max_khz": _khz(fields[2]),
                    "policy_max_khz": _khz(fields[3]),
                    "cur_khz": _khz(fields[4]),
                    "governor": None if fields[5] == "-" else fields[5],
                })
        elif kind == "thermal":
            fields = rest.split()
            if len(fields) == 3 and fields[2].lstrip("-").isdigit():
                facts["thermal"].append({"zone": fields[0], "type": fields[1],
                                         "temp_c": int(fields[2]) / 1000.0})
    facts["cores"].sort(key=lambda core: core["cpu"])
    for core in facts["cores"]:
        core["part"] = parts_by_cpu.get(core["cpu"])
    facts["cpu_model"] = " / ".join(models) or None
    return facts


def _online(fp: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in fp.get("cores", []) if c.get("online")]


def flags(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Reasons to distrust timings taken between two fingerprints, as short stable names:
    ``emulated``, ``non-performance-governor``, ``throttling``, ``loaded``, ``low-memory``."""
    out = []
    if before.get("emulated") or after.get("emulated"):
        out.append("emulated")
    governors = {c["governor"] for fp in (before, after) for c in _online(fp) if c["governor"]}
    if governors - {"performance"}:
        out.append("non-performance-governor")
    if _throttled(before) or _throttled(after):
        out.append("throttling")
    ncpu = max(len(_online(before)), 1)
    load = (before.get("loadavg") or [0.0])[0]
    if load > max(LOADED_MIN, LOADED_PER_CPU * ncpu):
        out.append("loaded")
    total, available = before.get("mem_total_kb"), before.get("mem_available_kb")
    if total and available is not None and available < LOW_MEMORY_RATIO * total:
        out.append("low-memory")
    return out


def _throttled(fp: dict[str, Any]) -> bool:
    for core in _online(fp):
        hw_max, cap, cur = core["max_khz"], core["policy_max_khz"], core["cur_khz"]
        if hw_max and cap and cap < CAPPED_RATIO * hw_max:
            return True
        # Under the performance governor an unthrottled core runs at its policy maximum.
        if core["governor"] == "performance" and cap and cur and cur < CAPPED_RATIO * cap:
            return True
    return any(zone["temp_c"] >= HOT_C for zone in fp.get("thermal", []))
