"""The local farm's three boards each run the build of their own instruction-set level: the
emulated Cortex-A72 the armv8-a build (no dot product), the emulated RK3588 the dot-product
build, the x86 node the highest its CPU features allow (read from the board before its first
run, recorded by its fingerprints after: a second experiment plans the same builds, so its runs
are the first's). The report's builds table and `runs show` name each level."""

from __future__ import annotations

from pathlib import Path

from fixtures_ray import CoordFarm

from db.store import Store
from devices import isa
from devices.inventory import load_inventory
from harness.cli import main
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from reports.aggregate import builds_table


def test_each_farm_board_runs_the_build_of_its_level(ray_address: str, coord_farm: CoordFarm,
                                                     tmp_path: Path, capsys) -> None:
    inventory = load_inventory(coord_farm.inventory)
    spec_path = tmp_path / "levels.toml"
    url = f"sqlite:///{tmp_path}/levels.db"
    store = Store.open(url)
    levels = {}
    for round_ in (1, 2):
        spec_path.write_text(f"""
name = "levels-{round_}"
devices = ["farm-x86", "farm-arm", "farm-a72"]
warmups = 0
[engine]
threads = 1
[[workload]]
kind = "attn-bench"
ctx = [64]
heads = [2]
kv_heads = [1]
head_dim = [32]
""")
        summary = run_experiment(RunRequest(load_spec(spec_path), inventory), store)
        # the second round's runs are the first's: the same builds, the same keys
        assert (summary.total, summary.counts["ok"]) == (3, 3 if round_ == 1 else 0), summary
        runs = store.frames(f"levels-{round_}")["runs"]
        levels[round_] = dict(zip(runs["device_name"], runs["build_isa"], strict=True))
        table = builds_table(runs)
        assert set(table["isa"]) == set(levels[round_].values())
    assert levels[1] == levels[2] == {
        "farm-x86": isa.highest("x86_64", isa.host_features()).name,
        "farm-arm": "armv8.2-a+dotprod", "farm-a72": "armv8-a"}
    # `runs show` names the build's level
    runs = store.frames("levels-1")["runs"]
    a72_run = runs[runs["device_name"] == "farm-a72"]["run_key"].iloc[0]
    capsys.readouterr()
    assert main(["--db", url, "runs", "show", str(a72_run)]) == 0
    assert "build aarch64 armv8-a;" in capsys.readouterr().out
