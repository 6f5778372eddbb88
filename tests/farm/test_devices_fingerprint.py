"""Fingerprints: parsing an RK3588's /proc and /sys, flags, and probing the real farm."""

from __future__ import annotations

import copy
import json

from devices.conditions import run_flags, snapshot_flags
from devices.connect import connect
from devices.fingerprint import parse_probe, probe
from harness.cli import main

# What PROBE_SCRIPT prints on an idle RK3588 (4x A55 at 1.8 GHz, 4x A76 at 2.4 GHz).
RK3588_OUTPUT = "\n".join([
    "arch aarch64",
    "kernel 6.1.43-rockchip",
    "loadavg 0.08 0.10 0.09",
    "mem MemTotal 16194660 kB",
    "mem MemAvailable 15000000 kB",
    *[line for cpu in range(8) for line in (
        f"cpuinfo processor={cpu}",
        "cpuinfo CPU implementer=0x41",
        f"cpuinfo CPU variant={'0x2' if cpu < 4 else '0x4'}",
        f"cpuinfo CPU part={'0xd05' if cpu < 4 else '0xd0b'}")],
    *[f"core {cpu} 1 {max_khz} {max_khz} {max_khz} performance"
      for cpu, max_khz in [(c, 1800000 if c < 4 else 2400000) for c in range(8)]],
    "thermal thermal_zone0 soc-thermal 41600",
    "thermal thermal_zone1 bigcore0-thermal 42500",
    "devfreq dmc performance 2112000000 528000000 2112000000 "
    "528000000 1068000000 1560000000 2112000000",
    "devfreq fb000000.gpu simple_ondemand 300000000 300000000 1000000000 "
    "300000000 400000000 600000000 800000000 1000000000",
])


def test_parse_rk3588_core_layout() -> None:
    fp = parse_probe(RK3588_OUTPUT)
    assert fp["arch"] == "aarch64" and fp["kernel"] == "6.1.43-rockchip"
    assert fp["loadavg"] == [0.08, 0.10, 0.09]
    assert (fp["mem_total_kb"], fp["mem_available_kb"]) == (16194660, 15000000)
    big = [c["cpu"] for c in fp["cores"] if c["max_khz"] == 2400000]
    assert big == [4, 5, 6, 7]
    assert {c["part"] for c in fp["cores"] if c["cpu"] in big} == {"0xd0b"}  # Cortex-A76
    assert fp["thermal"][1] == {"zone": "thermal_zone1", "type": "bigcore0-thermal",
                                "temp_c": 42.5}
    assert fp["devfreq"][0] == {"device": "dmc", "governor": "performance",
                                "cur_hz": 2112000000, "min_hz": 528000000, "max_hz": 2112000000,
                                "available_hz": [528000000, 1068000000, 1560000000, 2112000000]}
    assert fp["devfreq"][1]["device"] == "fb000000.gpu" and fp["devfreq"][1]["cur_hz"] == 3 * 10**8
    # RK3588's /proc/cpuinfo has no model name: the parts identify the CPU
    assert fp["cpu_model"] is None
    assert fp["cpu_id"] == "implementer 0x41 variant 0x2,0x4 part 0xd05,0xd0b"


def test_parse_x86_identification() -> None:
    cores = [line for cpu in range(2) for line in (
        f"cpuinfo processor={cpu}", "cpuinfo vendor_id=GenuineIntel", "cpuinfo cpu family=6",
        "cpuinfo model=167", "cpuinfo model name=Intel(R) Xeon(R) Processor",
        "cpuinfo stepping=1")]
    fp = parse_probe("\n".join(["arch x86_64", *cores]))
    assert fp["cpu_model"] == "Intel(R) Xeon(R) Processor"  # "model" is not the model name
    assert fp["cpu_id"] == "vendor GenuineIntel family 6 model 167 stepping 1"


def flags(before: dict, after: dict) -> list[str]:
    """A run's flags as the coordinator stores them: each snapshot judged when it is taken."""
    return run_flags({**before, "flags": snapshot_flags(before, "before")},
                     {**after, "flags": snapshot_flags(after, "after")})


def test_flags_for_a_healthy_board_are_empty() -> None:
    fp = parse_probe(RK3588_OUTPUT)
    assert flags(fp, fp) == []  # an idle GPU below its maximum is no reason to distrust a run


def test_flags_name_each_problem() -> None:
    before = parse_probe(RK3588_OUTPUT)
    after = copy.deepcopy(before)
    after["cores"][5]["policy_max_khz"] = 1608000  # thermal cap on a big core
    assert flags(before, after) == ["throttling"]

    hot = copy.deepcopy(before)
    hot["thermal"][1]["temp_c"] = 88.0
    assert flags(before, hot) == ["throttling"]

    slow = copy.deepcopy(before)
    for core in slow["cores"]:
        core["governor"] = "schedutil"
    assert flags(slow, slow) == ["non-performance-governor"]

    busy = copy.deepcopy(before)
    busy["loadavg"] = [5.5, 3.0, 1.0]
    busy["mem_available_kb"] = 100000
    busy["emulated"] = True
    assert flags(busy, after) == ["emulated", "throttling", "loaded", "low-memory"]
    # the load and free memory after a run are the run's own doing
    assert flags(before, busy) == ["emulated"]


def test_memory_controller_below_its_maximum_is_flagged() -> None:
    before = parse_probe(RK3588_OUTPUT)
    no_dvfs = copy.deepcopy(before)  # a bootloader without DMC DVFS: stuck at the lowest step
    no_dvfs["devfreq"][0].update(governor="dmc_ondemand", cur_hz=528000000)
    assert flags(no_dvfs, before) == ["memory-clock-low"]
    capped = copy.deepcopy(before)  # a user cap: max_freq lowered, so is the clock
    capped["devfreq"][0].update(max_hz=1560000000, cur_hz=1560000000)
    assert flags(before, capped) == ["memory-clock-low"]
    unlisted = copy.deepcopy(before)  # no available_frequencies: judged against max_freq
    unlisted["devfreq"][0].update(available_hz=[], max_hz=2112000000, cur_hz=1068000000)
    assert flags(unlisted, unlisted) == ["memory-clock-low"]


def test_snapshots_stored_without_flags_are_judged_the_same() -> None:
    before = parse_probe(RK3588_OUTPUT)
    busy = copy.deepcopy(before)
    busy.update(loadavg=[6.0, 1.0, 1.0], mem_available_kb=1000, emulated=True)
    busy["devfreq"][0]["cur_hz"] = 528000000
    for pair in [(before, before), (busy, before), (before, busy), (busy, busy)]:
        assert run_flags(*pair) == flags(*pair)  # old snapshots: computed on read, same answer
    # a stored judgement is what the report shows, even when the rules change later
    assert run_flags({**busy, "flags": []}, {**before, "flags": ["throttling"]}) == ["throttling"]


def test_probe_on_the_farm_nodes(farm) -> None:
    for device in (farm.x86, farm.arm):
        with connect(device) as t:
            fp = probe(t)
        assert fp["device"] == device.name and fp["target_arch"] == device.arch
        assert fp["arch"] == "x86_64"  # both nodes are this machine; farm-arm emulates
        assert fp["kernel"] and fp["cpu_model"] and fp["mem_total_kb"] > 0
        assert fp["cpu_id"].startswith("vendor ")  # x86: lscpu's vendor, family, model
        assert len(fp["loadavg"]) == 3 and fp["cores"]
        assert fp["emulated"] == device.emulated
        assert ("emulated" in fp["flags"]) == device.emulated
        assert fp["flags"] == snapshot_flags(fp, "before") and "devfreq" in fp
        json.dumps(fp)  # the coordinator stores it as JSON


def test_cli_probe_prints_json_per_device(farm, capsys) -> None:
    assert main(["devices", "probe", "--inventory", str(farm.inventory_path), "rk3588"]) == 0
    snapshots = json.loads(capsys.readouterr().out)
    assert list(snapshots) == ["farm-arm"]
    assert snapshots["farm-arm"]["emulated"] is True
