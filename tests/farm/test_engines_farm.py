"""lmc and llama.cpp's llama-bench in one spec on a local farm node (the x86 node, and the
emulated aarch64 node): real Ray, a real SQLite store, llama-bench built from the sdist's
llama.cpp and a GGUF converted in the test. The stored rows are checked against llama-bench's
own JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_ray import CoordFarm

from db.store import Store
from devices.inventory import load_inventory
from harness.engines.llamabench import BUILD_FIELDS, LlamaBenchConfig, bench_test_name, options
from harness.errors import InputError
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from harness.verify.reproduce import reproduce
from reports.aggregate import timing_table
from reports.audit.evidence import select
from reports.compare import compare_runs
from reports.render import render_report
from reports.runs import load_experiment

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import vs_llamacpp  # noqa: E402

CTX, MAX_NEW, REPS = 24, 4, 2


@pytest.mark.slow
@pytest.mark.parametrize(("device", "build"), [("farm-x86", "llama_bench"),
                                               ("farm-arm", "llama_bench_aarch64")])
def test_both_engines_on_a_farm_node(device: str, build: str, request: pytest.FixtureRequest,
                                     ray_address: str, coord_farm: CoordFarm,
                                     needle_model: Path, tmp_path: Path) -> None:
    binary = request.getfixturevalue(build)  # llama-bench for the node's arch (opt-in)
    inventory = load_inventory(coord_farm.inventory)
    spec_path = tmp_path / "engines.toml"
    spec_path.write_text(f"""
name = "engines"
model = "{needle_model}"
devices = ["{device}"]
engines = ["lmc", "llama-bench"]
# the levels of the cached llama-bench builds (tests/fixtures_llama.py): no second build
isa = ["v3", "armv8.2-a+dotprod"]
warmups = 0
[engine]
threads = 1
[llama-bench]
threads = 1
repetitions = {REPS}
[[workload]]
kind = "decode"
ctx = {CTX}
max_new = {MAX_NEW}
""")
    store = Store.open(f"sqlite:///{tmp_path}/engines.db")
    summary = run_experiment(RunRequest(load_spec(spec_path), inventory), store)
    assert (summary.total, summary.counts["ok"]) == (2, 2), summary

    frames = store.frames("engines")
    runs = frames["runs"]
    assert sorted(runs["engine"]) == ["llama-bench", "lmc"]
    assert (runs["engine"] == runs["build_engine"]).all()
    assert set(runs["build_target"]) == {inventory.devices[device].arch}
    outcomes = frames["outcomes"].set_index("measurement_id")
    llama = runs[runs["engine"] == "llama-bench"]
    assert set(llama["model_sha256"]) != set(runs.loc[runs["engine"] == "lmc", "model_sha256"])
    for row in llama.itertuples():
        own = json.loads(row.raw_json)  # llama-bench's stdout on the board, verbatim
        pp = next(r for r in own if r["n_prompt"] == CTX and r["n_gen"] == 0)
        tg = next(r for r in own if r["n_prompt"] == 0 and r["n_gen"] == MAX_NEW)
        assert row.prefill_ms == pp["avg_ns"] / 1e6 and row.prompt_tokens == CTX
        assert row.decode_ms_per_token == tg["avg_ns"] / MAX_NEW / 1e6
        stored = json.loads(outcomes.loc[row.measurement_id, "extra"])["llama_bench"]
        assert [t["samples_ns"] for t in stored["tests"]] == [r["samples_ns"] for r in own]
        assert all(len(t["samples_ns"]) == REPS for t in stored["tests"])
        assert stored["build"] == {k: own[0][k] for k in BUILD_FIELDS}
        assert row.threads == 1 and all(r["n_threads"] == 1 for r in own)

    # llama-bench run here by hand (under the node's emulator, if any) on the same GGUF gives
    # the same tests of the same model
    row = llama.iloc[0]
    mine = subprocess.run(
        [*inventory.devices[device].exec_prefix, str(binary), "-m", row["model_path"],
         *options(CTX, MAX_NEW, LlamaBenchConfig("f32", 1, REPS, 0, "f16", pg=False))],
        capture_output=True, text=True, timeout=600, check=True)
    by_hand = json.loads(mine.stdout)
    farm_rows = json.loads(row["raw_json"])
    assert [bench_test_name(r) for r in by_hand] == [bench_test_name(r) for r in farm_rows]
    for field in ("model_type", "model_size", "model_n_params", "type_k", "build_commit",
                  "backends"):
        assert [r[field] for r in by_hand] == [r[field] for r in farm_rows]

    # reports put the engines side by side, per device; compare pairs them per device
    data = load_experiment(store, "engines")
    table = timing_table(data.runs)
    assert sorted(table["config"]) == ["exact t=1", "llama-bench kv=f16 t=1"]
    comparison = compare_runs(data.runs, "lmc", "llama-bench")
    assert list(comparison.table["device"]) == [device]
    assert comparison.table["median_b"].iloc[0] == pytest.approx(row["decode_ms_per_token"])
    assert len(select(data.runs, {"engine": ["llama-bench"]})) == 1  # claims select by engine
    # bench/vs_llamacpp.py's table: both engines' figures and their ratio, per metric
    side = vs_llamacpp.side_by_side(store, "engines").set_index("metric")
    lmc = runs[runs["engine"] == "lmc"].iloc[0]
    for metric, column in (("decode ms/token", "decode_ms_per_token"),
                           ("prefill ms", "prefill_ms")):
        assert side.loc[metric, "device"] == device
        assert side.loc[metric, "lmc"] == pytest.approx(lmc[column])
        assert side.loc[metric, "llama-bench"] == pytest.approx(row[column])
        assert side.loc[metric, "ratio llama-bench/lmc"] == pytest.approx(row[column]
                                                                          / lmc[column])
    index = render_report(store, "engines", tmp_path / "report")
    assert "llama-bench kv=f16 t=1" in index.read_text()
    with pytest.raises(InputError, match="reproduce reruns lmc runs only"):
        reproduce(store, str(row["run_key"]), inventory)
    store.close()
