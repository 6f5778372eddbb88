"""Instruction-set levels chosen per board (devices.isa, harness.plan.matrix.pool_level): the
highest a board's CPU features allow by default, a pin in the spec or the inventory, refused
with exit 2 naming the board and the features it lacks; each level a build target of its own
and a distinct run key."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import isa
from devices.errors import InventoryError
from devices.inventory import load_inventory
from harness.cli import main
from harness.plan.matrix import resolve_placements
from harness.spec import load_spec


def emulated(name: str, cls: str, cpu: str) -> str:
    """An inventory table: an aarch64 board emulated as ``cpu``."""
    return f"""
[[device]]
name = "{name}"
host = "127.0.0.1"
arch = "aarch64"
class = "{cls}"
exec_prefix = ["qemu-aarch64-static", "-cpu", "{cpu}"]
emulated = true
"""


INVENTORY = emulated("pi4", "rpi4", "cortex-a72") + emulated("rk", "rk3588", "cortex-a76") + """
[[device]]
name = "x86box"
host = "127.0.0.1"
arch = "x86_64"
class = "x86"
{pin}
"""

SPEC = """name = "levels"
devices = {devices}
{isa}
[[workload]]
kind = "attn-bench"
ctx = [256]
"""


def write(tmp_path: Path, devices: str = '["pi4", "rk"]', isa_line: str = "",
          pin: str = "") -> tuple[Path, Path]:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(INVENTORY.format(pin=pin))
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(devices=devices, isa=isa_line))
    return spec, inventory


def test_each_board_gets_the_highest_level_its_cpu_has(tmp_path: Path) -> None:
    spec_path, inventory_path = write(tmp_path, devices='["pi4", "rk", "x86box", "local"]')
    boards = list(load_inventory(inventory_path).devices.values())
    recorded = {"x86box": {"cpu_features": sorted(isa.LEVELS["x86_64"][1].features)}}  # v3
    placements = resolve_placements(load_spec(spec_path), boards, None, recorded)
    levels = {p.selector: p.isa for p in placements}
    assert levels["pi4"] == "armv8-a" and levels["rk"] == "armv8.2-a+dotprod"
    assert levels["x86box"] == "v3"
    assert levels["local"] == isa.highest("x86_64", isa.host_features()).name
    targets = {p.selector: p.build_target for p in placements}
    assert targets["pi4"] == "aarch64:armv8-a" != targets["rk"]
    # never fingerprinted: the level every build had before there were levels
    unknown = resolve_placements(load_spec(spec_path), boards, ["x86box"])
    assert unknown[0].isa == "v3"


@pytest.mark.parametrize("dry", [True, False])
def test_a_pinned_level_the_board_lacks_is_refused_with_exit_2(tmp_path: Path, capsys,
                                                               sqlite_url: str,
                                                               dry: bool) -> None:
    spec_path, inventory_path = write(tmp_path, isa_line='isa = ["armv8.2-a+dotprod"]')
    code = main(["--db", sqlite_url, "run", str(spec_path), "--inventory", str(inventory_path),
                 *(["--dry-run"] if dry else [])])
    err = capsys.readouterr().err
    assert code == 2
    assert "board 'pi4'" in err and "armv8.2-a+dotprod" in err
    assert "asimddp" in err and "asimdhp" in err
    # the same pin on the board that has it plans
    spec_path, _ = write(tmp_path, devices='["rk"]', isa_line='isa = ["armv8.2-a+dotprod"]')
    assert main(["--db", sqlite_url, "run", str(spec_path), "--inventory", str(inventory_path),
                 "--dry-run"]) == 0


def test_a_spec_pin_picks_a_lower_level_and_an_inventory_pin_is_checked(tmp_path: Path) -> None:
    spec_path, inventory_path = write(tmp_path, devices='["rk", "pi4"]',
                                      isa_line='isa = ["armv8-a"]')
    boards = list(load_inventory(inventory_path).devices.values())
    placements = resolve_placements(load_spec(spec_path), boards)
    assert {p.isa for p in placements} == {"armv8-a"}  # one build serves both boards
    spec_path, inventory_path = write(tmp_path, pin='isa = "armv8-a"')
    with pytest.raises(InventoryError, match="isa.*a level of aarch64"):
        load_inventory(inventory_path)


def test_levels_are_checked_in_the_spec(tmp_path: Path, capsys, sqlite_url: str) -> None:
    for line, message in (('isa = ["v9"]', "'v9' is not an instruction-set level"),
                          ('isa = ["v3", "v4"]', "pin one per architecture")):
        spec_path, inventory_path = write(tmp_path, isa_line=line)
        code = main(["--db", sqlite_url, "run", str(spec_path), "--inventory",
                     str(inventory_path), "--dry-run"])
        assert code == 2 and message in capsys.readouterr().err


def test_each_level_is_a_build_of_its_own_in_the_run_key(tmp_path: Path) -> None:
    from harness.engines.lmc.build import build_identity
    from harness.plan.matrix import expand, run_key

    spec_path, inventory_path = write(tmp_path, devices='["x86box"]')
    spec = load_spec(spec_path)
    boards = list(load_inventory(inventory_path).devices.values())
    cell = expand(spec, resolve_placements(spec, boards))[0]
    keys = {}
    for name in ("v2", "v3", "v4"):
        record = build_identity(f"x86_64:{name}")
        assert record.isa == name and any(f.startswith("-march=x86-64-") for f in record.cflags)
        keys[name] = run_key(record.__dict__, None, "w", cell)
    assert len(set(keys.values())) == 3
