"""Device fingerprints: the machine facts that decide whether a timing can be trusted.

``probe`` takes one snapshot (one remote command, reading /proc and /sys only, so it works the
same on any board whatever compiler it has). The coordinator takes one before and one after
every run; ``probed_run`` does both and the run in a single remote command. Each snapshot carries
its ``flags`` (``devices.conditions``): what should make a reader distrust the numbers.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.boardlock import LockHolder, check_locked, locked
from devices.cache import INTACT_FUNCTION, ArtifactCache
from devices.conditions import snapshot_flags
from devices.errors import CommandTimeout, DeviceError, TransferFailed
from devices.isa import QEMU_MODELS, emulated_model
from devices.transport import KILL_AFTER_S, CommandResult, Transport, describe, device_argv

# /2: devfreq devices and the snapshot's flags; /3: cpu_id (vendor, family, model, stepping);
# /4: cpu_features (/proc/cpuinfo's flags or Features: the instruction sets, devices.isa)
SCHEMA = "benchfarm.fingerprint/4"
PROBE_TIMEOUT_S = 30.0
# What a probed run's whole command gets beyond the engine's own timeout: the engine's kill
# delay and the two fingerprints (built-in reads, well under a second). With the transport's
# grace a probed run waits at most timeout + PROBED_EXTRA_S + GRACE_S (timeout + 16 s).
PROBED_EXTRA_S = KILL_AFTER_S + 5.0
STALE_EXIT = 99  # probed_run's script: an artifact changed since it was verified; nothing ran

# Constant scripts: nothing from the inventory or the user is interpolated into them. A probe is
# taken before and after every run, so what it reads it reads with the shell's built-in `read`
# and starts no process. `probe static` adds what cannot change while the device is up (arch,
# kernel, /proc/cpuinfo: one sed, and /proc/cpuinfo is slow to read on some kernels); the
# first probe on a connection takes it, later ones reuse it (see probed_run).
PROBE_FUNCTIONS = r"""
get() {  # get FILE DEFAULT: sets v to the first line of FILE, or to DEFAULT
  v=
  { read -r v || [ -n "$v" ]; } 2>/dev/null < "$1"
  [ -n "$v" ] || v=$2
}
probe() {
  if [ "$1" = static ]; then
    get /proc/sys/kernel/arch ''; [ -n "$v" ] || v=$(uname -m)  # not in older kernels
    printf 'arch %s\n' "$v"
    get /proc/sys/kernel/osrelease ''; printf 'kernel %s\n' "$v"
    sed -n -E \
      -e 's/^(processor|model name|Hardware|CPU part)[[:space:]]*:[[:space:]]*/cpuinfo \1=/p' \
      -e 's/^(vendor_id|cpu family|model|stepping)[[:space:]]*:[[:space:]]*/cpuinfo \1=/p' \
      -e 's/^(CPU implementer|CPU variant)[[:space:]]*:[[:space:]]*/cpuinfo \1=/p' \
      /proc/cpuinfo
    sed -n -E '/^(flags|Features)[[:space:]]*:/{s/^[^:]*:[[:space:]]*/features /p;q}' /proc/cpuinfo
  fi
  read -r l1 l5 l15 rest < /proc/loadavg; printf 'loadavg %s %s %s\n' "$l1" "$l5" "$l15"
  while read -r key value rest; do
    case $key in MemTotal: | MemAvailable:) printf 'mem %s %s\n' "${key%:}" "$value" ;; esac
    [ "$key" = MemAvailable: ] && break
  done < /proc/meminfo
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
  for d in /sys/class/devfreq/*; do  # memory controller (dmc), GPU, NPU clocks, in Hz
    [ -r "$d/cur_freq" ] || continue
    line="devfreq ${d##*/}"
    for name in governor cur_freq min_freq max_freq; do get "$d/$name" -; line="$line $v"; done
    get "$d/available_frequencies" ''; printf '%s %s\n' "$line" "$v"
  done
}
"""
PROBE_SCRIPT = PROBE_FUNCTIONS + "probe static\nexit 0\n"

# $1 = marker, $2 = timeout (s), $3 = "static" or "-" (the first probe's argument); then the
# arguments of INTACT_FUNCTION; then the command. When
# the artifacts are not intact, prints "<marker> stale" on stderr and exits 99 without running
# anything. Otherwise, on stderr: "<marker> before", a probe, "<marker> engine", the command's
# stderr, "\n<marker> after <exit code> <start> <end>" (ns since the epoch, GNU date; "%N"
# elsewhere) and a probe. The command runs under GNU timeout, which signals its whole process
# group at the deadline, as in Transport.run.
PROBED_RUN_SCRIPT = PROBE_FUNCTIONS + INTACT_FUNCTION + r"""
marker=$1 limit=$2 first=$3
shift 3
if ! intact "$@"; then
  printf '%s stale\n' "$marker" >&2
  exit STALE_EXIT
fi
shift $((4 + 2 * $4))
{ printf '%s before\n' "$marker"; probe "$first"; printf '%s engine\n' "$marker"; } >&2
start=$(date +%s%N)
timeout -k KILL_AFTER "$limit" "$@"
code=$?
end=$(date +%s%N)
{ printf '\n%s after %s %s %s\n' "$marker" "$code" "$start" "$end"; probe; } >&2
exit "$code"
""".replace("KILL_AFTER", f"{KILL_AFTER_S:.0f}").replace("STALE_EXIT", str(STALE_EXIT))

def probe(transport: Transport) -> dict[str, Any]:
    """One fingerprint of the device behind ``transport`` (a JSON-ready dict)."""
    result = transport.run_host(["sh", "-c", PROBE_SCRIPT], timeout=PROBE_TIMEOUT_S)
    if result.exit_code != 0:
        raise DeviceError(transport.device.name, f"probe failed with exit code "
                                                 f"{result.exit_code}: {result.stderr.strip()}")
    return _facts(transport, result.stdout, time.time(), "before")


@dataclass
class ProbedRun:
    before: dict[str, Any]
    result: CommandResult  # wall_s: the command alone, timed on the device where it can be
    after: dict[str, Any]


def probed_run(transport: Transport, argv: list[str], timeout: float,
               cpus: list[int] | None = None, stdin_file: Path | None = None,
               lock: LockHolder | None = None, cache: ArtifactCache | None = None) -> ProbedRun:
    """``probe``, ``transport.run(argv, ...)``, ``probe`` in one remote command instead of three.

    With ``cache`` (pushes through ``transport``), the artifacts that ``argv`` names (elements
    equal to paths its pushes returned) are checked first, in the same command: each blob's
    stat signature must be the one it had when it was verified, each tree entry must still
    link to its blob (see devices.cache). If
    not, nothing runs; they are pushed again (verified, repaired) and the command is sent once
    more. So a caller may push an artifact once per connection and still run only verified
    artifacts.

    The command's stdout is its own; the fingerprints travel on stderr between marker lines that
    carry a random token, and the command's stderr is returned without them. Its wall time is
    taken on the device (GNU date), so it leaves out the SSH round trip; where the device's
    `date` has no nanoseconds it is the whole remote command's wall time.

    With ``lock`` (its holder) the whole command runs under the board's lock file
    (devices.boardlock) and raises BoardLocked, having run nothing, when another coordinator's
    command holds it.
    """
    marker = f"benchfarm-probe-{secrets.token_hex(8)}"
    pushes = cache or ArtifactCache(transport)  # a fresh one names no artifact: nothing to check
    for attempt in (1, 2):
        first = "-" if transport.static_facts else "static"
        command = ["sh", "-c", PROBED_RUN_SCRIPT, "sh", marker, f"{timeout:.1f}", first,
                   *pushes.intact_args(argv), *device_argv(transport.device, argv, cpus)]
        if lock:
            command = locked(command, lock)
        started = time.time()
        whole = transport.run_host(command, timeout=timeout + PROBED_EXTRA_S,
                                   stdin_file=stdin_file)
        if lock:
            check_locked(transport.device.name, transport.device.workdir, whole)
        if not (whole.exit_code == STALE_EXIT and whole.stderr == f"{marker} stale\n"):
            break
        if attempt == 2:
            raise TransferFailed(transport.device.name, f"the cached artifacts of "
                                                        f"`{describe(argv)}` changed again on "
                                                        "the device right after a push")
        pushes.push_again(argv)
    name = transport.device.name
    try:
        before, rest = _between(whole.stderr, f"{marker} before\n", f"{marker} engine\n")
        stderr, rest = rest.split(f"\n{marker} after ", 1)
        status, _, after = rest.partition("\n")
        code, start_ns, end_ns = status.split()
    except ValueError:
        raise DeviceError(name, f"`{describe(argv)}` under fingerprints ended with exit code "
                                f"{whole.exit_code} before its last fingerprint: "
                                f"{whole.stderr.strip()[-500:]}") from None
    wall = whole.wall_s
    if start_ns.isdigit() and end_ns.isdigit():
        wall = (int(end_ns) - int(start_ns)) / 1e9
    if int(code) in (124, 137) and wall >= timeout:  # GNU timeout's codes (see devices.ssh)
        raise CommandTimeout(name, f"`{describe(argv)}` ran past its {timeout:g} s timeout; its "
                                   "process group was killed")
    result = CommandResult(whole.exit_code, whole.stdout, stderr, wall)
    return ProbedRun(_facts(transport, before, started, "before"), result,
                     _facts(transport, after, time.time(), "after"))


def _between(text: str, head: str, tail: str) -> tuple[str, str]:
    """(what lies between ``head`` at the start of text and ``tail``, what follows ``tail``)."""
    if not text.startswith(head):
        raise ValueError(head)
    inner, rest = text[len(head):].split(tail, 1)
    return inner, rest


STATIC_FACTS = ("arch", "kernel", "cpu_model", "cpu_id", "cpu_features")


def _facts(transport: Transport, probe_output: str, taken_at: float,
           phase: str) -> dict[str, Any]:
    facts = parse_probe(probe_output)
    if facts["arch"] is not None:  # a `probe static`: keep its static part for this connection
        transport.static_facts = {key: facts[key] for key in STATIC_FACTS}
        transport.static_facts["parts"] = {core["cpu"]: core["part"] for core in facts["cores"]}
    elif transport.static_facts:
        facts.update({key: transport.static_facts[key] for key in STATIC_FACTS})
        for core in facts["cores"]:
            core["part"] = transport.static_facts["parts"].get(core["cpu"])
    model = emulated_model(transport.device.exec_prefix) if transport.device.emulated else None
    if model in QEMU_MODELS:  # the board's CPU is the emulator's, not the host's
        facts["cpu_features"] = sorted(QEMU_MODELS[model])
    facts.update(
        schema=SCHEMA,
        device=transport.device.name,
        target_arch=transport.device.arch,
        emulated=transport.device.emulated,
        taken_at=taken_at,
    )
    facts["flags"] = snapshot_flags(facts, phase)  # judged now, stored with the snapshot
    return facts


def _whole(text: str) -> int | None:  # a frequency field: kHz (cpufreq) or Hz (devfreq)
    return int(text) if text.isdigit() else None


def parse_probe(text: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"arch": None, "kernel": None, "loadavg": None, "mem_total_kb": None,
                             "mem_available_kb": None, "cpu_model": None, "cpu_features": None,
                             "cores": [],
                             "thermal": [], "devfreq": []}
    parts_by_cpu: dict[int, str] = {}
    current_cpu = -1
    models: list[str] = []
    ids: dict[str, list[str]] = {}  # lscpu's identification fields, each distinct value once
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("arch", "kernel"):
            facts[kind] = rest.strip()
        elif kind == "features":  # the CPU's instruction-set features (devices.isa)
            facts["cpu_features"] = sorted(set(rest.split()))
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
                _add(ids, "part", value)
            elif key in CPU_ID_FIELDS:
                _add(ids, CPU_ID_FIELDS[key], value)
            elif value and value not in models:
                models.append(value)
        elif kind == "core":
            fields = rest.split()
            if len(fields) == 6 and fields[0].isdigit():
                facts["cores"].append({
                    "cpu": int(fields[0]),
                    "online": fields[1] != "0",
                    "max_khz": _whole(fields[2]),
                    "policy_max_khz": _whole(fields[3]),
                    "cur_khz": _whole(fields[4]),
                    "governor": None if fields[5] == "-" else fields[5],
                })
        elif kind == "thermal":
            fields = rest.split()
            if len(fields) == 3 and fields[2].lstrip("-").isdigit():
                facts["thermal"].append({"zone": fields[0], "type": fields[1],
                                         "temp_c": int(fields[2]) / 1000.0})
        elif kind == "devfreq":
            fields = rest.split()
            if len(fields) >= 5:
                facts["devfreq"].append({
                    "device": fields[0],
                    "governor": None if fields[1] == "-" else fields[1],
                    "cur_hz": _whole(fields[2]),
                    "min_hz": _whole(fields[3]),
                    "max_hz": _whole(fields[4]),
                    "available_hz": [int(f) for f in fields[5:] if f.isdigit()],
                })
    facts["cores"].sort(key=lambda core: core["cpu"])
    for core in facts["cores"]:
        core["part"] = parts_by_cpu.get(core["cpu"])
    facts["cpu_model"] = " / ".join(models) or None
    facts["cpu_id"] = " ".join(f"{name} {','.join(ids[name])}" for name in CPU_ID_ORDER
                               if name in ids) or None
    return facts


# /proc/cpuinfo's identification fields (what lscpu shows as vendor, family, model, stepping;
# implementer, variant and part on ARM) under the names cpu_id gives them, in its order
CPU_ID_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
                 "stepping": "stepping", "CPU implementer": "implementer",
                 "CPU variant": "variant"}
CPU_ID_ORDER = ("vendor", "family", "model", "stepping", "implementer", "variant", "part")


def _add(ids: dict[str, list[str]], name: str, value: str) -> None:
    if value and value not in ids.setdefault(name, []):
        ids[name].append(value)
