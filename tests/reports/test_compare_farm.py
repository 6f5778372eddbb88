"""compare on real runs: the real engine and model on the farm's x86 node and its emulated ARM
node (qemu), real Ray, a real SQLite store. This tests the plumbing: which stored runs become
each side's samples and that the row says what the statistics say of them. What the statistics
decide (a slowdown found, an A/A comparison not flagged) holds only with some probability on
real timings, so it is tested on seeded samples (tests/reports/test_compare.py)."""

from __future__ import annotations

from pathlib import Path

from fixtures_ray import CoordFarm

from db.store import Store
from devices.inventory import load_inventory
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from reports.compare import compare, load_runs
from reports.stats import compare_samples


def exact_spec(folder: Path, name: str, model: Path, device: str, repeats: int,
               depth: float) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
model = "{model}"
devices = ["{device}"]
warmups = 1
repeats = {repeats}

[engine.policy.exact]

[[workload]]
kind = "needle"
ctx = 128
depth = [{depth}]
seed = 0
max_new = 6
""")
    return path


def decode_times(store: Store, experiment: str, parity: int | None = None) -> list[float]:
    """The stored runs' decode timings, read without `compare`: one sample per run."""
    runs = load_runs(store, [experiment])
    runs = runs[runs["status"] == "ok"]
    if parity is not None:
        runs = runs[runs["repeat"] % 2 == parity]
    return runs["decode_ms_per_token"].tolist()


def test_compare_samples_the_independent_runs_of_each_side(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/cmp.db")
    inventory = load_inventory(coord_farm.inventory)
    plans = [("once-x86", "farm-x86", 1, 0.2), ("once-arm", "farm-arm", 1, 0.2),
             ("many-x86", "farm-x86", 8, 0.6), ("many-arm", "farm-arm", 4, 0.6)]
    for name, device, repeats, depth in plans:
        spec = load_spec(exact_spec(tmp_path, name, needle_model, device, repeats, depth))
        assert run_experiment(RunRequest(spec, inventory), store).counts["ok"] == repeats

    # one run a side: no test can decide, whatever the timings
    once = compare(store, "farm-x86", "farm-arm", ["once-x86", "once-arm"])
    (row,) = once.table.itertuples()
    assert (row.n_a, row.n_b, row.change, row.needed) == (1, 1, "inconclusive", 4)
    assert row.p_value is None or row.p_value != row.p_value  # no p-value from one run a side
    assert "1 inconclusive" in once.summary() and "set repeats = 4 or more" in once.summary()

    # repeats: each run is one sample, and the row is the statistics of exactly those samples
    many = compare(store, "farm-x86", "farm-arm", ["many-x86", "many-arm"])
    (row,) = many.table.itertuples()
    expected = compare_samples(decode_times(store, "many-x86"), decode_times(store, "many-arm"),
                               many.threshold)
    assert (row.n_a, row.n_b) == (8, 4), many.table
    assert (row.ratio, row.p_value, row.change) == (expected.ratio, expected.p_value,
                                                    expected.verdict), many.table
    assert f"1 {expected.verdict}" in many.summary() and "B: emulated" in many.common_flags

    # A/A: even against odd repeats of the same cell
    same = compare(store, "farm-x86", "farm-x86", ["many-x86"], threshold=0.2)
    (row,) = same.table.itertuples()
    expected = compare_samples(decode_times(store, "many-x86", 0),
                               decode_times(store, "many-x86", 1), same.threshold)
    assert (row.n_a, row.n_b) == (4, 4), same.table
    assert (row.ratio, row.p_value, row.change) == (expected.ratio, expected.p_value,
                                                    expected.verdict), same.table
    store.close()
