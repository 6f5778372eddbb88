"""Engine switches and workload text as spec axes: validated with file and key, crossed only
with the policies that take them, reaching the real engine (its JSON echoes its config), and
leaving the run keys of runs at the defaults unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_engine import run_lmc
from fixtures_ray import stored_runs

from db.store import Store
from devices.inventory import load_inventory
from harness.errors import InputError
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from harness.workloads import load_tokenizer

# words the tiny model's tokenizer knows, in sentences its built-in grammar does not make
FILLER = ("The painter carried a red lantern across the valley. The doctor sold bread near the "
          "bridge every morning. A small dog slept by the river.")
NEEDLE = "The code of {key} is {value}."
QUESTION = "What is the code of {key}?"


def spec_text(model: Path, name: str, switches: bool) -> str:
    sparse = ("importance = [true, false]\nrecency = [true, false]\n"
              "probe_summary = [false, true]\n" if switches else "")
    exact = "ref_attn = [false, true]\n" if switches else ""
    text = (f'filler = "filler.txt"\nneedle = "{NEEDLE}"\nquestion = "{QUESTION}"\n'
            if switches else "")
    return f"""name = "{name}"
model = "{model}"
devices = ["local"]
warmups = 0
[engine.policy.exact]
{exact}
[engine.policy.sparse]
k = 2
block = 16
{sparse}
[engine.policy.h2o]
k = 2
block = 16
{"recency = false" if switches else ""}
[[workload]]
kind = "needle"
ctx = 160
max_new = 4
{text}"""


def test_switches_and_text_reach_the_engine_and_keep_default_keys(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    (tmp_path / "filler.txt").write_text(FILLER)
    plain, varied = tmp_path / "plain.toml", tmp_path / "varied.toml"
    plain.write_text(spec_text(needle_model, "plain", switches=False))
    varied.write_text(spec_text(needle_model, "varied", switches=True))
    inventory = load_inventory(None)
    with Store.open(f"sqlite:///{tmp_path}/switches.db") as store:
        first = run_experiment(RunRequest(load_spec(plain), inventory, ["local"]), store)
        assert first.counts["ok"] == 3  # exact, sparse, h2o
        # the varied spec's workload differs (filler, needle): none of its runs are done yet
        summary = run_experiment(RunRequest(load_spec(varied), inventory, ["local"]), store)
        runs = stored_runs(store, "varied")
        workload = store.get_run(int(runs["id"].iloc[0])).workload
    assert summary.total == 2 + 8 + 1 and summary.counts["ok"] == summary.total
    echoed = []
    for _, run in runs.iterrows():
        config = json.loads(run["config"]) if isinstance(run["config"], str) else run["config"]
        engine = json.loads(run["raw_json"])["config"]
        # what the spec asked for (absent: the engine's default) is what the engine ran with
        assert engine["importance"] is config.get("importance", True)
        assert engine["recency"] is config.get("recency", True)
        assert engine["probe_summary"] is config.get("probe_summary", False)
        assert engine["ref_attn"] is config.get("ref_attn", False)
        echoed.append((run["policy"], engine["importance"], engine["recency"],
                       engine["probe_summary"], engine["ref_attn"]))
    assert sorted(e for e in echoed if e[0] == "sparse") == sorted(
        ("sparse", i, r, p, False) for i in (True, False) for r in (True, False)
        for p in (True, False))
    assert sorted(e for e in echoed if e[0] != "sparse") == [
        ("exact", True, True, False, False), ("exact", True, True, False, True),
        ("h2o", True, False, False, False)]
    # the prompt is made of the spec's filler and needle sentence
    text = load_tokenizer(needle_model).decode(workload["ids"])
    assert FILLER.split(". ")[1] in text and "The code of " in text
    assert "What is the code of " in text and "secret code" not in text

    # the same settings at the engine's defaults are the same runs: nothing is redone
    defaults = tmp_path / "defaults.toml"
    defaults.write_text(spec_text(needle_model, "defaults", switches=False).replace(
        "k = 2\nblock = 16\n\n[engine.policy.h2o]",
        "k = 2\nblock = 16\nimportance = true\nprobe_summary = false\n[engine.policy.h2o]"
    ).replace("[engine.policy.exact]\n", "[engine.policy.exact]\nref_attn = false\n"))
    with Store.open(f"sqlite:///{tmp_path}/switches.db") as store:
        again = run_experiment(RunRequest(load_spec(defaults), inventory, ["local"]), store)
    assert (again.total, again.skipped) == (3, 3)


@pytest.mark.parametrize("table,line,key", [
    ("[engine.policy.h2o]", "importance = false", "engine.policy.h2o.importance"),
    ("[engine.policy.sparse]", "ref_attn = true", "engine.policy.sparse.ref_attn"),
    ("[engine.policy.exact]", "recency = false", "engine.policy.exact.recency"),
    ("[engine.policy.sparse]", 'recency = "off"', "engine.policy.sparse.recency"),
    ("[[workload]]", 'needle = "no placeholders"', "workload[0].needle"),
    ("[[workload]]", 'question = "no key"', "workload[0].question"),
    ("[[workload]]", 'filler = "missing.txt"', "workload[0].filler"),
])
def test_switches_and_text_are_validated(needle_model: Path, tmp_path: Path, table: str,
                                         line: str, key: str) -> None:
    text = spec_text(needle_model, "bad", switches=False).replace(table, f"{table}\n{line}", 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_spec(path)
    assert str(path) in str(caught.value) and f"key '{key}'" in str(caught.value)


def test_selection_traces_are_fetched_from_the_board_and_stored(
        ray_address: str, needle_model: Path, lmc: Path, tmp_path: Path) -> None:
    spec = tmp_path / "trace.toml"
    spec.write_text(spec_text(needle_model, "trace", switches=False).replace(
        "warmups = 0\n", "warmups = 0\n[engine]\ntrace_selection = true\n"))
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    with Store.open(f"sqlite:///{tmp_path}/trace.db") as store:
        summary = run_experiment(RunRequest(load_spec(spec), load_inventory(inventory),
                                            ["local"]), store)
        assert summary.counts["ok"] == 3
        details = [store.get_run(int(i)) for i in stored_runs(store, "trace")["id"]]
    for detail in details:
        trace = detail.outcome["extra"]["selection_trace"]
        options = detail.run["config"]["argv_options"]
        assert "--trace-selection" in options
        # the same engine on the same ids and flags writes the same trace here
        prompt = tmp_path / "ids.txt"
        prompt.write_text(" ".join(map(str, detail.workload["ids"])))
        options[options.index("--trace-selection") + 1] = str(tmp_path / "again.txt")
        run_lmc(lmc, "generate", "--model", str(needle_model), "--prompt", str(prompt),
                *options)
        assert trace == (tmp_path / "again.txt").read_text()
        steps = len(detail.token_timings)
        assert steps and len(trace.splitlines()) == 1 + steps * 2 * 2  # layers x heads
    assert list((tmp_path / "work").iterdir()) and not list((tmp_path / "work").glob("*trace*"))
