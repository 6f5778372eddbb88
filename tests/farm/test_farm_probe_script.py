"""The fingerprint script itself, run by `sh` here against a made-up /proc and /sys: files that
are missing, unreadable or lack a final newline, offline cores, zones without a temperature,
and the devfreq devices of an RK3588 (memory controller, GPU, NPU)."""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

import pytest

from devices import isa
from devices.conditions import snapshot_flags
from devices.fingerprint import PROBE_SCRIPT, parse_probe

CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull crc32 atomics fphp asimdhp cpuid lrcpc dcpop asimddp
CPU part\t: 0xd05

processor\t: 4
model name\t: ARMv8 Processor rev 0 (v8l)
CPU part\t: 0xd0b
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_root(root: Path, with_arch_file: bool) -> None:
    proc, cpu = root / "proc", root / "sys/devices/system/cpu"
    write(proc / "sys/kernel/osrelease", "6.1.43-rockchip\n")
    if with_arch_file:
        write(proc / "sys/kernel/arch", "aarch64\n")
    write(proc / "loadavg", "0.08 0.10 0.09 1/234 5678\n")
    write(proc / "meminfo", "MemTotal:       16194660 kB\nMemFree:         9000000 kB\n"
                            "MemAvailable:   15000000 kB\nBuffers:           12345 kB\n")
    write(proc / "cpuinfo", CPUINFO)
    # cpu0: no `online` file (always online), current frequency unreadable
    write(cpu / "cpu0/cpufreq/cpuinfo_max_freq", "1800000\n")
    write(cpu / "cpu0/cpufreq/scaling_max_freq", "1800000\n")
    (cpu / "cpu0/cpufreq/scaling_cur_freq").mkdir()
    write(cpu / "cpu0/cpufreq/scaling_governor", "schedutil\n")
    # cpu4: offline, a policy cap, a file without its final newline
    write(cpu / "cpu4/online", "0\n")
    write(cpu / "cpu4/cpufreq/cpuinfo_max_freq", "2400000\n")
    write(cpu / "cpu4/cpufreq/scaling_max_freq", "2208000")
    write(cpu / "cpu4/cpufreq/scaling_cur_freq", "2208000\n")
    write(cpu / "cpu4/cpufreq/scaling_governor", "performance\n")
    # cpu5: no cpufreq at all
    write(cpu / "cpu5/online", "1\n")
    write(cpu / "cpufreq/policy0/scaling_governor", "not a core\n")
    thermal = root / "sys/class/thermal"
    write(thermal / "thermal_zone0/type", "soc-thermal\n")
    write(thermal / "thermal_zone0/temp", "41600\n")
    write(thermal / "thermal_zone1/type", "no-temperature\n")
    write(thermal / "thermal_zone2/temp", "-5000\n")
    # /sys/class/devfreq as an RK3588 with a vendor kernel lays it out: the DDR controller
    # ("dmc") idling at its lowest step under dmc_ondemand, GPU and NPU by their bus addresses
    devfreq = root / "sys/class/devfreq"
    for name, governor, cur, steps in [
            ("dmc", "dmc_ondemand", "528000000", "528000000 1068000000 1560000000 2112000000"),
            ("fb000000.gpu", "simple_ondemand", "300000000",
             "300000000 400000000 500000000 600000000 700000000 800000000 900000000 1000000000"),
            ("fdab0000.npu", "rknpu_ondemand", "1000000000",
             "300000000 400000000 500000000 600000000 700000000 800000000 900000000 1000000000")]:
        write(devfreq / name / "governor", governor + "\n")
        write(devfreq / name / "cur_freq", cur + "\n")
        write(devfreq / name / "min_freq", steps.split()[0] + "\n")
        write(devfreq / name / "max_freq", steps.split()[-1] + "\n")
        write(devfreq / name / "available_frequencies", steps + " \n")  # the kernel's last space
    write(devfreq / "not-a-device/name", "no cur_freq here\n")


def run_script(root: Path) -> str:
    # Every absolute /proc or /sys path of the script, moved under root.
    script = re.sub(r"(?<![\w/])/(proc|sys)/", lambda m: f"{root}/{m.group(1)}/", PROBE_SCRIPT)
    assert script.count(str(root)) == 9  # each path of the script was moved
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    return done.stdout


@pytest.mark.parametrize("with_arch_file", [True, False])
def test_probe_script_reads_every_fact_with_defaults(tmp_path: Path, with_arch_file: bool) -> None:
    fake_root(tmp_path, with_arch_file)
    fp = parse_probe(run_script(tmp_path))
    # Without /proc/sys/kernel/arch (older kernels) the script asks uname: this machine's arch.
    assert fp["arch"] == ("aarch64" if with_arch_file else platform.machine())
    assert fp["kernel"] == "6.1.43-rockchip"
    assert fp["loadavg"] == [0.08, 0.10, 0.09]
    assert (fp["mem_total_kb"], fp["mem_available_kb"]) == (16194660, 15000000)
    assert fp["cpu_model"] == "ARMv8 Processor rev 0 (v8l)"
    # the first core's features: an RK3588's, which run the dot-product level (devices.isa)
    assert "asimddp" in fp["cpu_features"] and fp["cpu_features"] == sorted(fp["cpu_features"])
    assert isa.highest("aarch64", fp["cpu_features"]).name == "armv8.2-a+dotprod"
    assert fp["cores"] == [
        {"cpu": 0, "online": True, "max_khz": 1800000, "policy_max_khz": 1800000,
         "cur_khz": None, "governor": "schedutil", "part": "0xd05"},
        {"cpu": 4, "online": False, "max_khz": 2400000, "policy_max_khz": 2208000,
         "cur_khz": 2208000, "governor": "performance", "part": "0xd0b"},
        {"cpu": 5, "online": True, "max_khz": None, "policy_max_khz": None, "cur_khz": None,
         "governor": None, "part": None},
    ]
    assert fp["thermal"] == [
        {"zone": "thermal_zone0", "type": "soc-thermal", "temp_c": 41.6},
        {"zone": "thermal_zone2", "type": "?", "temp_c": -5.0},
    ]
    hundreds = [n * 10**8 for n in range(3, 11)]
    assert fp["devfreq"] == [
        {"device": "dmc", "governor": "dmc_ondemand", "cur_hz": 528 * 10**6,
         "min_hz": 528 * 10**6, "max_hz": 2112 * 10**6,
         "available_hz": [528 * 10**6, 1068 * 10**6, 1560 * 10**6, 2112 * 10**6]},
        {"device": "fb000000.gpu", "governor": "simple_ondemand", "cur_hz": 3 * 10**8,
         "min_hz": 3 * 10**8, "max_hz": 10**9, "available_hz": hundreds},
        {"device": "fdab0000.npu", "governor": "rknpu_ondemand", "cur_hz": 10**9,
         "min_hz": 3 * 10**8, "max_hz": 10**9, "available_hz": hundreds},
    ]
    # the DDR clock at a quarter of its maximum is flagged (the GPU idling low is not)
    assert "memory-clock-low" in snapshot_flags(fp, "before")
    for dev in fp["devfreq"]:
        dev["cur_hz"] = dev["max_hz"]
    assert "memory-clock-low" not in snapshot_flags(fp, "after")
