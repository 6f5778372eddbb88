"""Fingerprints: parsing an RK3588's /proc and /sys, flags, and probing the real farm."""

from __future__ import annotations

import copy
import json

from devices.fingerprint import flags, parse_probe, probe
from devices.transport import connect
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
        f"cpuinfo CPU part={'0xd05' if cpu < 4 else '0xd0b'}")],
    *[f"core {cpu} 1 {max_khz} {max_khz} {max_khz} performance"
      for cpu, max_khz in [(c, 1800000 if c < 4 else 2400000) for c in range(8)]],
    "thermal thermal_zone0 soc-thermal 41600",
    "thermal thermal_zone1 bigcore0-thermal 42500",
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


def test_flags_for_a_healthy_board_are_empty() -> None:
    fp = parse_probe(RK3588_OUTPUT)
    assert flags(fp, fp) == []


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


def test_probe_on_the_farm_nodes(farm) -> None:
    for device in (farm.x86, farm.arm):
        with connect(device) as t:
            fp = probe(t)
        assert fp["device"] == device.name and fp["target_arch"] == device.arch
        assert fp["arch"] == "x86_64"  # both nodes are this machine; farm-arm emulates
        assert fp["kernel"] and fp["cpu_model"] and fp["mem_total_kb"] > 0
        assert len(fp["loadavg"]) == 3 and fp["cores"]
        assert fp["emulated"] == device.emulated
        assert ("emulated" in flags(fp, fp)) == device.emulated
        json.dumps(fp)  # the coordinator stores it as JSON


def test_cli_probe_prints_json_per_device(farm, capsys) -> None:
    assert main(["devices", "probe", "--inventory", str(farm.inventory_path), "rk3588"]) == 0
    snapshots = json.loads(capsys.readouterr().out)
    assert list(snapshots) == ["farm-arm"]
    assert snapshots["farm-arm"]["emulated"] is True
