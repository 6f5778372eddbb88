"""lmc and llama.cpp's llama-bench in one spec on the local farm: the x86 node and the emulated
aarch64 node, real Ray, a real SQLite store, llama-bench built from the sdist's llama.cpp and a
GGUF converted in the test. The stored rows are checked against llama-bench's own JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures_ray import CoordFarm

from db.store import Store
from devices.inventory import load_inventory
from harness.coordinator import run_experiment
from harness.engines.llamabench import BUILD_FIELDS, LlamaBenchConfig, bench_test_name, options
from harness.errors import InputError
from harness.reproduce import reproduce
from harness.spec import load_spec
from reports.aggregate import load_experiment, timing_table
from reports.audit.evidence import select
from reports.compare import compare_runs
from reports.render import render_report

CTX, MAX_NEW, REPS = 24, 4, 2


@pytest.mark.slow
def test_both_engines_on_both_farm_nodes(ray_address: str, coord_farm: CoordFarm,
                                         needle_model: Path, llama_bench: Path,
                                         llama_bench_aarch64: Path, tmp_path: Path) -> None:
    spec_path = tmp_path / "engines.toml"
    spec_path.write_text(f"""
name = "engines"
model = "{needle_model}"
devices = ["farm-x86", "farm-arm"]
engines = ["lmc", "llama-bench"]
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
    summary = run_experiment(load_spec(spec_path), load_inventory(coord_farm.inventory), store)
    assert (summary.total, summary.counts["ok"]) == (4, 4), summary

    frames = store.frames("engines")
    runs = frames["runs"]
    assert sorted(zip(runs["device_name"], runs["engine"], strict=True)) == [
        ("farm-arm", "llama-bench"), ("farm-arm", "lmc"),
        ("farm-x86", "llama-bench"), ("farm-x86", "lmc")]
    assert (runs["engine"] == runs["build_engine"]).all()
    assert dict(zip(runs["device_name"], runs["build_target"], strict=True)) == \
        {"farm-arm": "aarch64", "farm-x86": "x86_64"}
    outcomes = frames["outcomes"].set_index("run_id")
    llama = runs[runs["engine"] == "llama-bench"]
    assert set(llama["model_sha256"]) != set(runs.loc[runs["engine"] == "lmc", "model_sha256"])
    for row in llama.itertuples():
        own = json.loads(row.raw_json)  # llama-bench's stdout on the board, verbatim
        pp = next(r for r in own if r["n_prompt"] == CTX and r["n_gen"] == 0)
        tg = next(r for r in own if r["n_prompt"] == 0 and r["n_gen"] == MAX_NEW)
        assert row.prefill_ms == pp["avg_ns"] / 1e6 and row.prompt_tokens == CTX
        assert row.decode_ms_per_token == tg["avg_ns"] / MAX_NEW / 1e6
        stored = json.loads(outcomes.loc[row.id, "extra"])["llama_bench"]
        assert [t["samples_ns"] for t in stored["tests"]] == [r["samples_ns"] for r in own]
        assert all(len(t["samples_ns"]) == REPS for t in stored["tests"])
        assert stored["build"] == {k: own[0][k] for k in BUILD_FIELDS}
        assert row.threads == 1 and all(r["n_threads"] == 1 for r in own)

    # llama-bench run here by hand on the same GGUF gives the same tests of the same model
    x86 = llama[llama["device_name"] == "farm-x86"].iloc[0]
    mine = subprocess.run(
        [str(llama_bench), "-m", x86["model_path"],
         *options(CTX, MAX_NEW, LlamaBenchConfig("f32", 1, REPS, 0, "f16", pg=False))],
        capture_output=True, text=True, timeout=300, check=True)
    by_hand = json.loads(mine.stdout)
    farm_rows = json.loads(x86["raw_json"])
    assert [bench_test_name(r) for r in by_hand] == [bench_test_name(r) for r in farm_rows]
    for field in ("model_type", "model_size", "model_n_params", "type_k", "build_commit"):
        assert [r[field] for r in by_hand] == [r[field] for r in farm_rows]

    # reports put the engines side by side, per device; compare pairs them per device
    data = load_experiment(store, "engines")
    table = timing_table(data.runs)
    assert sorted(zip(table["device"], table["config"], strict=True)) == [
        ("farm-arm", "exact t=1"), ("farm-arm", "llama-bench kv=f16 t=1"),
        ("farm-x86", "exact t=1"), ("farm-x86", "llama-bench kv=f16 t=1")]
    comparison = compare_runs(data.runs, data.steps, "lmc", "llama-bench")
    assert sorted(comparison.table["device"]) == ["farm-arm", "farm-x86"]
    for row in comparison.table.itertuples():
        mask = (llama["device_name"] == row.device)
        assert row.median_b == pytest.approx(llama.loc[mask, "decode_ms_per_token"].iloc[0])
    assert len(select(data.runs, {"engine": ["llama-bench"]})) == 2  # claims select by engine
    index = render_report(store, "engines", tmp_path / "report")
    assert "llama-bench kv=f16 t=1" in index.read_text()
    with pytest.raises(InputError, match="reproduce reruns lmc runs only"):
        reproduce(store, str(x86["run_key"]), load_inventory(coord_farm.inventory))
    store.close()
