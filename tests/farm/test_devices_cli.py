"""`benchfarm devices check` against the real farm, with stand-in engines built per arch."""

from __future__ import annotations

import json
from pathlib import Path

from db.store import Store
from devices.health import check_device
from harness.cli import main
from harness.engines import health_command
from harness.engines.lmc import NAME as LMC


def binaries_args(args_program: dict[str, Path]) -> list[str]:
    return [x for arch, path in args_program.items() for x in ("--binary", f"{arch}={path}")]


def test_check_passes_on_both_farm_nodes(farm, args_program, capsys, sqlite_url) -> None:
    argv = ["--db", sqlite_url, "devices", "check", "--json", "--inventory",
            str(farm.inventory_path),
            *binaries_args(args_program), "farm-x86", "farm-arm"]
    assert main(argv) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["device"] for r in reports] == ["farm-x86", "farm-arm"]
    for report in reports:
        names = [c["name"] for c in report["checks"]]
        assert names == ["reachable", "arch", "workdir", "free disk", "lmc info",
                         "memory read", "fma peak"]
        assert report["ok"], report
        # the board's limits, measured there by bench/c's programs built for its arch
        limits = {c["key"]: c["value"] for c in report["checks"] if c.get("key")}
        assert limits["read_gbps"] > 0 and limits["fma_gflops"] > 0, report
    arm_info = reports[1]["checks"][4]["detail"]
    assert "arch aarch64" in arm_info  # the binary really ran as aarch64 (under qemu)


def test_check_reports_a_wrong_binary_and_an_unreachable_device(farm, args_program,
                                                                tmp_path: Path, sqlite_url,
                                                                capsys) -> None:
    # An x86_64 binary cannot run on the aarch64 node: `lmc info` fails, the rest passes.
    report = check_device(farm.arm, health_command(LMC, args_program["x86_64"]))
    assert not report.ok
    assert [(i.name, i.ok) for i in report.items] == [
        ("reachable", True), ("arch", True), ("workdir", True), ("free disk", True),
        ("lmc info", False)]

    text = farm.inventory_path.read_text().replace(f"port = {farm.x86.port}\n", "port = 9\n")
    text = text.replace("connect_retries = 2", "connect_retries = 1")
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(text)
    argv = ["--db", sqlite_url, "devices", "check", "--inventory", str(inventory),
            *binaries_args(args_program), "farm-x86"]
    assert main(argv) == 1
    # the failed check is stored, and it took the board out of service
    with Store.open(sqlite_url) as store:
        [check] = store.boards.health("farm-x86")
        status = store.boards.states(["farm-x86"])["farm-x86"]
    assert not check.ok and check.items[0]["name"] == "reachable"
    assert status.state == "bad" and status.reason.startswith("health check failed: reachable")
    capsys.readouterr()
    assert main(["--db", sqlite_url, "devices", "health", "--inventory", str(inventory),
                 "farm-x86"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("farm-x86: bad") and "FAILED reachable" in shown


def test_check_rejects_a_malformed_binary_option(farm, capsys, sqlite_url) -> None:
    argv = ["--db", sqlite_url, "devices", "check", "--inventory", str(farm.inventory_path),
            "--binary", "mips=/x"]
    assert main(argv) == 2
    assert "--binary 'mips=/x': expected ARCH=PATH" in capsys.readouterr().err


def test_check_builds_and_runs_the_real_engine_on_both_nodes(farm, engine_build,
                                                             engine_build_aarch64, capsys,
                                                             sqlite_url) -> None:
    # The engine fixtures build first; the command's own build_engine calls then reuse them.
    argv = ["--db", sqlite_url, "devices", "check", "--json", "--inventory",
            str(farm.inventory_path),
            "farm-x86", "farm-arm"]
    assert main(argv) == 0
    reports = json.loads(capsys.readouterr().out)
    details = {r["device"]: r["checks"][4]["detail"] for r in reports}
    assert "arch x86_64" in details["farm-x86"] and "arch aarch64" in details["farm-arm"]
