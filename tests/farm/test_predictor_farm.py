"""gbm as a spec policy: the predictor file is an artifact named by its sha256 (in the run's
config and run key), pushed to the farm node by hash like the engine and the model;
``kv_budget`` as a spec axis (lmc --kv-budget), its KV memory stored per run;
``measure_keys`` (lmc --measure-keys): the key-ranking figures stored per run, shown by the
report and judged by the audit's key_rank metric. Real Ray, a real farm node over SSH, the
real engine and the shipped needle model; the reference is lmc run directly on this machine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from fixtures_engine import lmc_json, write_tokens
from fixtures_ray import CoordFarm, stored_runs

from db.store import Store
from devices.inventory import load_inventory
from harness.errors import InputError, RunFailure
from harness.execution.coordinator import RunRequest, run_experiment
from harness.predictor.dump import run_dump
from harness.predictor.train import train, write_predictor
from harness.spec import load_spec
from harness.verify.reproduce import reproduce
from harness.workloads import ppl_tokens
from reports.eviction import key_rank_table
from reports.runs import load_experiment

LENGTH = 96


def make_predictor(lmc: Path, model: Path, out: Path, max_iter: int) -> Path:
    """Cascade trees trained on one dumped text (tiny: the plumbing is under test here)."""
    dump = run_dump([str(lmc)], model, ppl_tokens(model, LENGTH, 7).ids, every=2, text=0)
    return write_predictor(train(dump, "cascade", max_iter=max_iter), out)


def gbm_spec(folder: Path, model: Path, predictor: str, devices: str = '["farm-x86"]',
             extra: str = "") -> Path:
    path = folder / "gbm.toml"
    path.write_text(f"""
name = "gbm-farm"
model = "{model}"
devices = {devices}
[engine]
prefill_attn = "sparse"
[engine.policy.exact]
[engine.policy.gbm]
predictor = "{predictor}"
k = 2
block = 16
kv_budget = [32, 48]
{extra}
[[workload]]
kind = "ppl"
length = {LENGTH}
seed = 0
""")
    return path


def test_gbm_runs_on_a_farm_node_with_its_predictor_pushed_by_hash(
        ray_address: str, coord_farm: CoordFarm, lmc: Path, needle_model: Path,
        tmp_path: Path) -> None:
    predictor = make_predictor(lmc, needle_model, tmp_path / "cascade.gbm", max_iter=4)
    sha = hashlib.sha256(predictor.read_bytes()).hexdigest()
    spec = load_spec(gbm_spec(tmp_path, needle_model, predictor.name))
    inventory = load_inventory(coord_farm.inventory)
    store = Store.open(f"sqlite:///{tmp_path}/gbm.db")
    summary = run_experiment(RunRequest(spec, inventory), store)
    assert (summary.total, summary.counts["ok"]) == (3, 3), summary

    runs = stored_runs(store, "gbm-farm")
    outcomes = store.frames("gbm-farm")["outcomes"].set_index("measurement_id")
    ids = write_tokens(tmp_path / "ids.txt", ppl_tokens(needle_model, LENGTH, 0).ids)
    budgets = set()
    exact_resident = int(outcomes.loc[runs.loc[runs["policy"] == "exact", "measurement_id"],
                                      "kv_resident_bytes"].iloc[0])
    for row in runs.itertuples():
        config = json.loads(row.config)
        memory = outcomes.loc[row.measurement_id]  # lmc's figures, stored in their columns
        assert memory["peak_rss_kb"] > 0 and memory["kv_allocated_bytes"] > 0
        if row.policy == "exact":
            assert "predictor" not in config and "kv_budget" not in config
            continue
        # eviction frees memory: the budget's KV is resident, not the whole context's
        assert memory["kv_resident_bytes"] < exact_resident < memory["kv_allocated_bytes"]
        assert config["predictor"] == sha  # the content's identity, not a path
        budgets.add(config["kv_budget"])
        options = config["argv_options"]
        assert options[options.index("--kv-budget") + 1] == str(config["kv_budget"])
        # the node ran the pushed copy: the same nll as lmc here with the driver's file
        local = lmc_json(lmc, "ppl", "--model", str(needle_model), "--text", str(ids),
                         "--attn", "gbm", "--predictor", str(predictor), "--block", "16",
                         "--k", "2", "--prefill-attn", "sparse",
                         "--kv-budget", str(config["kv_budget"]))
        assert outcomes.loc[row.measurement_id, "nll"] == pytest.approx(local["nll"], rel=0, abs=0)
    assert budgets == {32, 48}
    # the farm node's content-addressed cache holds the predictor under its sha256
    workdir = inventory.devices["farm-x86"].workdir
    assert list(Path(workdir).rglob(sha)), f"no cached copy named {sha} under {workdir}"
    nll = dict(zip(runs["run_key"], outcomes.loc[runs["measurement_id"], "nll"], strict=True))
    gbm_run = int(runs.loc[runs["policy"] == "gbm", "id"].iloc[0])
    repro = reproduce(store, str(gbm_run), inventory)  # the stored file, verified by hash
    assert (repro.status, repro.identical) == ("ok", True), repro.text()

    # other trees under the same file name are another run (exact is not redone)
    make_predictor(lmc, needle_model, predictor, max_iter=9)
    with pytest.raises(RunFailure, match=f"predictor {predictor}: the run used trees"):
        reproduce(store, str(gbm_run), inventory)
    again = run_experiment(RunRequest(load_spec(spec.path), inventory), store)
    assert (again.skipped, again.counts["ok"]) == (1, 2), again
    rerun = stored_runs(store, "gbm-farm")
    assert len(rerun) == 5 and len(set(rerun["run_key"]) - set(nll)) == 2
    store.close()


def test_spec_refuses_gbm_without_trees_and_budgets_where_lmc_cannot_evict(
        needle_model: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.gbm").write_text("not trees\n")
    cases = [
        (gbm_spec(tmp_path, needle_model, "missing.gbm"), "engine.policy.gbm.predictor"),
        (gbm_spec(tmp_path, needle_model, "notes.gbm"), "not an lmc-gbm predictor file"),
    ]
    for path, message in cases:
        with pytest.raises(InputError, match=message):
            load_spec(path)
    no_trees = tmp_path / "no-trees.toml"
    no_trees.write_text(f'name = "x"\nmodel = "{needle_model}"\n[engine.policy.gbm]\nk = 2\n'
                        '[[workload]]\nkind = "ppl"\nlength = 64\n')
    with pytest.raises(InputError, match="engine.policy.gbm.predictor.*gbm needs its trees"):
        load_spec(no_trees)
    for policy, budget, message in (("exact", 64, "exact attention takes no policy axes"),
                                    ("window", 16, "less than one block")):
        bad = tmp_path / f"{policy}.toml"
        bad.write_text(f'name = "x"\nmodel = "{needle_model}"\n[engine.policy.{policy}]\n'
                       f'kv_budget = {budget}\n[[workload]]\nkind = "ppl"\nlength = 64\n')
        with pytest.raises(InputError, match=f"engine.policy.{policy}.kv_budget"):
            load_spec(bad)
        with pytest.raises(InputError, match=message):
            load_spec(bad)


RANK_CLAIMS = """
source = "test"
[experiment.rank]
model = "{model}"
repeats = 1
warmups = 0
[experiment.rank.engine]
measure_keys = 8
[experiment.rank.engine.policy.window]
[experiment.rank.engine.policy.random]
[experiment.rank.engine.policy.exact]
[[experiment.rank.workload]]
kind = "ppl"
length = {length}
seed = [0, 1]

[[claim]]
id = "random-loses-half"
statement = "a random half loses about half"
metric = "key_rank"
at_least = 0.0
at_most = 1.0
experiment = "rank"
measure = {{ a = {{ policy = "random" }}, field = "lost50" }}

[[claim]]
id = "random-ranks-above-recency"
statement = "random orders keys better than recency"
metric = "key_rank"
at_least = 0.5
experiment = "rank"
measure = {{ a = {{ policy = "window" }}, b = {{ policy = "random" }}, field = "rho" }}
"""


def test_key_ranking_is_stored_per_run_and_judged_by_the_audit(
        ray_address: str, lmc: Path, needle_model: Path, tmp_path: Path) -> None:
    from harness.cli import main

    claims = tmp_path / "claims.toml"
    claims.write_text(RANK_CLAIMS.format(model=needle_model, length=LENGTH))
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    db = f"sqlite:///{tmp_path}/rank.db"
    assert main(["--db", db, "audit", str(claims), "--inventory", str(inventory),
                 "--ray-address", ray_address, "--out", str(tmp_path / "out")]) == 0

    # the reference: lmc run here on the same texts, its own key_ranking figures
    direct: dict[str, list[dict]] = {}
    for policy in ("window", "random"):
        for seed in (0, 1):
            ids = write_tokens(tmp_path / "t.txt", ppl_tokens(needle_model, LENGTH, seed).ids)
            doc = lmc_json(lmc, "ppl", "--model", str(needle_model), "--text", str(ids),
                           "--attn", policy, "--measure-keys", "8")
            direct.setdefault(policy, []).append(doc["key_ranking"])
    median = {p: {f: float(np.median([r[f] for r in rs])) for f in ("rho", "lost50")}
              for p, rs in direct.items()}
    verdicts = json.loads((tmp_path / "out" / "audit.json").read_text())
    lost, order = verdicts
    assert lost["measured"] == pytest.approx(median["random"]["lost50"], abs=1e-9)
    # the figures are the point here; with two windows the noise may leave a verdict
    # inconclusive (the verdict rules themselves are tested in test_audit.py)
    assert lost["verdict"] in ("reproduced", "inconclusive")
    assert len(lost["evidence"]["runs"]) == 2
    assert order["measured"] == pytest.approx(
        median["random"]["rho"] - median["window"]["rho"], abs=1e-9)
    assert order["verdict"] in (("reproduced", "inconclusive") if order["measured"] >= 0.5
                                else ("not reproduced", "inconclusive"))
    # exact has no keep score: its runs carry no ranking, and ran without --measure-keys
    with Store.open(db) as store:
        runs = stored_runs(store, "rank")
        for row in runs.itertuples():
            options = json.loads(row.config)["argv_options"]
            assert ("--measure-keys" in options) == (row.policy != "exact")
        table = key_rank_table(load_experiment(store, "rank").runs)
    assert sorted(table["config"].str.split().str[0]) == ["random", "window"]
    assert (table["n"] == 2).all()
