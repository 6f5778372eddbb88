"""A hostile board: whatever a board's `exec_prefix` prints goes through the schema check in
the actor. Real Ray, the real engine behind a real wrapper on the `local` device, a real SQLite
store: every hostile output becomes a `failed` run with its reason, the honest runs of the same
matrix are stored `ok`, nothing crashes the coordinator and nothing is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from fixtures_ray import stored_runs

from db.store import Store
from devices.inventory import load_inventory
from harness.contract import KEPT_STDOUT_CHARS
from harness.engines.lmc.output import EngineOutputError, parse, parse_trace
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from reports.render import render_report

HUGE = 10**30
# A plausible engine document whose fields the cases below replace.
GOOD = {"schema": "lmc/1", "command": "generate", "prompt_tokens": 5, "prefill_ms": 1.5,
        "tokens": [7, 8], "steps": [{"token": 7, "ms": 0.5, "attn_ms": 0.1},
                                    {"token": 8, "ms": 0.5, "attn_ms": 0.1}],
        "decode_ms_per_token": 0.5, "attn_ms_per_token": 0.1,
        "config": {"model_config": {"vocab_size": 100}}}

# --k value -> what the wrapper does instead of (or around) the engine; other runs are honest.
CASES = {
    1: ("echo '[1,2,3]'", "not an object"),
    2: ("""echo '{"tokens":["x"],"steps":[]}'""", "'schema'"),
    3: ("echo '" + json.dumps(GOOD | {"tokens": [HUGE], "steps": [
        {"token": HUGE, "ms": 1, "attn_ms": 1}]}) + "'", "'tokens[0]'"),
    4: ("echo '" + json.dumps(GOOD | {"steps": "zzz"}) + "'", "'steps'"),
    5: ("echo '" + json.dumps(GOOD | {"prefill_ms": "abc"}) + "'", "'prefill_ms'"),
    # the engine's real output, without its schema and command
    6: ("""\"$@\" | sed 's/"schema": "lmc\\/1", "command": "generate", //'""", "'schema'"),
    # the engine's real output followed by 100 MB of JSON whitespace
    7: ("\"$@\"; head -c 100000000 /dev/zero | tr '\\0' ' '", "more than"),
    # an engine failure whose stderr is HTML and markdown (escaped in every report format)
    8: ("echo '" + "<script>alert(1)</script> | [x](javascript:alert(1))" + "' >&2; exit 3",
        "<script>"),
}

WRAPPER = """#!/bin/sh
# a hostile board: picks its output by the run's --k value
k=""; prev=""
for arg in "$@"; do [ "$prev" = "--k" ] && k=$arg; prev=$arg; done
case "$k" in
{cases}
*) exec "$@" ;;
esac
"""


def write_wrapper(folder: Path) -> Path:
    cases = "\n".join(f"{k}) {shell} ;;" for k, (shell, _) in CASES.items())
    path = folder / "hostile-board.sh"
    path.write_text(WRAPPER.format(cases=cases))
    path.chmod(0o755)
    return path


def test_hostile_outputs_are_failed_runs_and_honest_ones_are_kept(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    wrapper = write_wrapper(tmp_path)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nexec_prefix = ["{wrapper}"]\n'
                         f'workdir = "{tmp_path}/work"\n')
    honest_k = max(CASES) + 1
    spec = tmp_path / "hostile.toml"
    spec.write_text(f"""
name = "hostile"
model = "{needle_model}"
devices = ["local"]
warmups = 0
[engine.policy.exact]
[engine.policy.sparse]
k = {[*CASES, honest_k]}
[[workload]]
kind = "needle"
ctx = 128
max_new = 4
""")
    with Store.open(f"sqlite:///{tmp_path}/hostile.db") as store:
        summary = run_experiment(RunRequest(load_spec(spec), load_inventory(inventory)), store)
        runs = stored_runs(store, "hostile")
    assert summary.complete and summary.counts["failed"] == len(CASES)
    assert len(runs) == len(CASES) + 2 and runs["run_key"].is_unique
    honest = runs[runs["k"].isna() | (runs["k"] == honest_k)]
    assert set(honest["status"]) == {"ok"} and honest["prefill_ms"].notna().all()
    for k, (_, reason) in CASES.items():
        run = runs[runs["k"] == k].iloc[0]
        assert run["status"] == "failed", (k, run["error"])
        assert reason in run["error"], (k, run["error"])
        assert pd.isna(run["prefill_ms"])  # nothing of the document was stored
        assert run["exit_code"] == (3 if k == 8 else 0)
        assert pd.isna(run["raw_json"]) or len(run["raw_json"]) <= KEPT_STDOUT_CHARS

    # the board's stderr is in the report as text, never as markup
    with Store.open(f"sqlite:///{tmp_path}/hostile.db") as store:
        render_report(store, "hostile", tmp_path / "report")
    for name in ("report.md", "index.html"):
        page = (tmp_path / "report" / name).read_text()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in page, name
    assert "\\| \\[x\\](javascript:alert(1))" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("stdout,reason", [
    ("NaN", "NaN"),
    (json.dumps(GOOD | {"prefill_ms": float("inf")}), "Infinity"),
    (json.dumps(GOOD | {"command": "ppl"}), "'command'"),
    (json.dumps(GOOD | {"tokens": [7, 100]}), "'tokens[1]'"),  # at the stated vocab size
    (json.dumps(GOOD | {"tokens": [7, True]}), "'tokens[1]'"),
    (json.dumps(GOOD | {"steps": GOOD["steps"][:1]}), "one step per generated token"),
    (json.dumps(GOOD | {"steps": [GOOD["steps"][0], {"token": 8, "ms": -1}]}), "'steps[1].ms'"),
    (json.dumps(GOOD | {"selection": {"mass": "x"}}), "'selection.mass'"),
    (json.dumps(GOOD | {"prompt_tokens": 2**64}), "'prompt_tokens'"),
    (json.dumps(GOOD | {"kv_memory": {"paged": 1}}), "'kv_memory'"),
    (json.dumps(GOOD | {"kv_memory": {"paged": True, "block_bytes": -1}}),
     "'kv_memory.block_bytes'"),
    (json.dumps(GOOD | {"peak_rss_kb": 1.5}), "'peak_rss_kb'"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_parse_refuses_documents_outside_the_schema(stdout: str, reason: str) -> None:
    with pytest.raises(EngineOutputError) as caught:
        parse(stdout, "generate")
    assert reason in str(caught.value)


def test_parse_accepts_the_documented_forms() -> None:
    assert parse(json.dumps(GOOD), "generate")["tokens"] == [7, 8]
    assert parse(json.dumps({"schema": "lmc/1", "command": "ppl", "tokens": 10, "nll": 2.5,
                             "ppl": 12.2}), "ppl")["nll"] == 2.5
    bench = {"schema": "lmc/1", "command": "attn-bench", "ctx": 64, "ms": 0.01,
             "runs": [0.01, 0.02], "selection": {"bytes_read": 8192, "mass": 1.0000001}}
    assert parse(json.dumps(bench), "attn-bench")["runs"] == [0.01, 0.02]


@pytest.mark.parametrize("data,reason", [
    (b"", "header"),
    (b"10 0 0 1 0\n", "header"),
    (b"# t\n10 0 0 2 0\n", "line 2"),  # says two blocks, lists one
    (b"# t\n10 0 0 1 -3\n", "line 2"),
    (b"# t\n\xff\n", "UTF-8"),
    (b"# t\n" + b"1 0 0 0\n" * (3 * 1024 * 1024), "more than"),
])
def test_parse_trace_refuses_what_the_engine_does_not_write(data: bytes, reason: str) -> None:
    with pytest.raises(EngineOutputError) as caught:
        parse_trace(data)
    assert reason in str(caught.value)


PPL = {"schema": "lmc/1", "command": "ppl", "tokens": 10, "nll": 2.5, "ppl": 12.2}
CANDIDATES = {"recall32_c32": 0.75, "recall32_c48": 0.875, "recall32_c64": 0.9375,
              "recall32_c96": 1.0, "kept32_c96": 0.5, "direct_queries": 0,
              "recall32_direct": None}
NO_CANDIDATES = {"cand_queries": 0} | dict.fromkeys(CANDIDATES) | {"direct_queries": 0}
RANKING = {"every": 8, "queries": 2, "rho": -0.25, "recall32": 0.5, "captured32": 0.5,
           "lost50": 0.25, "lost_keep": 0.25, "cand_queries": 1} | CANDIDATES | {
    "layers": [{"queries": 2, "rho": -0.25, "recall32": 0.5, "captured32": 0.5,
                "lost50": 0.25, "lost_keep": 0.25, "cand_queries": 1} | CANDIDATES,
               {"queries": 0, "rho": None, "recall32": None, "captured32": None,
                "lost50": None, "lost_keep": None} | NO_CANDIDATES]}


@pytest.mark.parametrize("ranking,reason", [
    (RANKING | {"rho": 1.5}, "'key_ranking.rho'"),
    (RANKING | {"lost50": None}, "'key_ranking.lost50'"),  # null only without queries
    (RANKING | {"lost_keep": 1.5}, "'key_ranking.lost_keep'"),
    (RANKING | {"direct_queries": 1}, "'key_ranking.recall32_direct'"),  # null with queries
    (RANKING | {"kept32_c96": None}, "'key_ranking.kept32_c96'"),  # null only without 128 keys
    (RANKING | {"recall32_c96": 1.25}, "'key_ranking.recall32_c96'"),
    (RANKING | {"cand_queries": -1}, "'key_ranking.cand_queries'"),
    (RANKING | {"layers": "all"}, "'key_ranking.layers'"),
    (RANKING | {"layers": [{"queries": 1, "rho": 0, "recall32": 2, "captured32": 0,
                            "lost50": 0, "lost_keep": 0} | NO_CANDIDATES]},
     "'key_ranking.layers[0].recall32'"),
    ([1], "'key_ranking'"),
])
def test_parse_checks_the_key_ranking_of_a_ppl_run(ranking, reason) -> None:
    assert parse(json.dumps(PPL | {"key_ranking": RANKING}), "ppl")["key_ranking"] == RANKING
    with pytest.raises(EngineOutputError) as caught:
        parse(json.dumps(PPL | {"key_ranking": ranking}), "ppl")
    assert reason in str(caught.value)
