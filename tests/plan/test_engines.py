"""Engine adapters: the same contract for lmc and llama.cpp's llama-bench, each against its real
binary, and the [llama-bench] spec section. The farm run of both engines is in
tests/farm/test_engines_farm.py."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import pytest

from db import lmc_axes
from db.records import Figures
from harness.engines import ENGINES, adapter_of
from harness.engines.llamabench import BUILD_FIELDS, LlamaBenchConfig, bench_test_name, options
from harness.engines.lmc import run_here
from harness.errors import InputError, RunFailure
from harness.spec import parse_spec
from harness.workloads import decode_prompt

CTX, MAX_NEW, REPS = 24, 4, 3


def llama_config(threads: int = 1) -> LlamaBenchConfig:
    return LlamaBenchConfig("f32", threads, REPS, 0, "f16", pg=False)


@pytest.fixture(scope="module")
def outputs(lmc: Path, llama_bench: Path, needle_model: Path, needle_gguf: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """engine -> (command, stdout) of one real run of each engine through its adapter."""
    folder = tmp_path_factory.mktemp("engine-outputs")
    ids = folder / "ids.txt"
    ids.write_text(" ".join(map(str, decode_prompt(needle_model, CTX, 0).ids)))
    argv = {
        "lmc": ("generate", adapter_of("lmc").argv(
            "generate", str(lmc), str(needle_model), False,
            ["--prompt", str(ids), "--max-new", str(MAX_NEW), "--threads", "1"])),
        "llama-bench": ("llama-bench", adapter_of("llama-bench").argv(
            "llama-bench", str(llama_bench), str(needle_gguf), False,
            options(CTX, MAX_NEW, llama_config()))),
    }
    found = {}
    for name, (command, args) in argv.items():
        done = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found[name] = (command, done.stdout)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENGINES))
def test_adapter_contract(name: str, outputs: dict[str, tuple[str, str]]) -> None:
    adapter = adapter_of(name)
    command, stdout = outputs[name]
    figures = adapter.figures(command, adapter.parse(stdout, command))
    assert isinstance(figures, Figures)
    assert figures.prompt_tokens == CTX
    assert figures.prefill_ms is not None and figures.prefill_ms > 0
    assert figures.decode_ms_per_token is not None and figures.decode_ms_per_token > 0
    json.dumps(figures.extra)  # stored as JSON
    # an adapter refuses the other engine's output and plain garbage
    for other, (_, text) in outputs.items():
        if other != name:
            with pytest.raises(ValueError):
                adapter.parse(text, command)
    with pytest.raises(ValueError):
        adapter.parse("Segmentation fault\n", command)
    argv = adapter.health_argv("/bin/engine")
    assert argv[0] == "/bin/engine" and len(argv) == 2


@pytest.mark.slow
def test_llama_bench_figures_are_its_own_json(outputs: dict[str, tuple[str, str]]) -> None:
    rows = json.loads(outputs["llama-bench"][1])
    adapter = adapter_of("llama-bench")
    figures = adapter.figures("llama-bench",
                                 adapter.parse(outputs["llama-bench"][1], "llama-bench"))
    by_shape = {(r["n_prompt"], r["n_gen"]): r for r in rows}
    pp, tg = by_shape[(CTX, 0)], by_shape[(0, MAX_NEW)]
    for row in (pp, tg):
        assert len(row["samples_ns"]) == REPS and row["n_threads"] == 1
        assert abs(statistics.mean(row["samples_ns"]) - row["avg_ns"]) <= 1  # integer mean
    assert figures.prefill_ms == pp["avg_ns"] / 1e6
    assert figures.decode_ms_per_token == tg["avg_ns"] / MAX_NEW / 1e6
    tests = figures.extra["llama_bench"]["tests"]
    assert [t["test"] for t in tests] == [bench_test_name(r) for r in rows] == \
        [f"pp{CTX}", f"tg{MAX_NEW}"]
    assert [t["samples_ns"] for t in tests] == [r["samples_ns"] for r in rows]
    assert figures.extra["llama_bench"]["build"] == {k: rows[0][k] for k in BUILD_FIELDS}


@pytest.mark.parametrize(("name", "binary"), [("lmc", "lmc"), ("llama-bench", "llama_bench")])
def test_health_check_runs_the_real_engine(name: str, binary: str, request: pytest.FixtureRequest,
                                           args_program: dict[str, Path]) -> None:
    # what `devices check` runs, from the adapter: a working engine passes for its arch only
    adapter, path = adapter_of(name), request.getfixturevalue(binary)
    done = subprocess.run(adapter.health_argv(str(path)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    ok, detail = adapter.health_verdict(done.stdout, done.stderr, "x86_64")
    assert ok, detail
    # another program's output (the stand-in engine echoes its argv) is not a healthy engine
    other = subprocess.run([str(args_program["x86_64"]), "--version"], capture_output=True,
                           text=True, timeout=60)
    assert not adapter.health_verdict(other.stdout, other.stderr, "x86_64")[0]
    if name == "lmc":
        assert not adapter.health_verdict(done.stdout, done.stderr, "aarch64")[0]


def test_lmc_argv_puts_the_ids_on_stdin_for_its_command() -> None:
    adapter = adapter_of("lmc")
    assert adapter.argv("ppl", "/b/lmc", "/m", True, ["--threads", "2"]) == \
        ["/b/lmc", "ppl", "--model", "/m", "--text", "-", "--threads", "2"]
    assert adapter.argv("attn-bench", "/b/lmc", None, False, ["--ctx", "8"]) == \
        ["/b/lmc", "attn-bench", "--ctx", "8"]
    with pytest.raises(InputError, match="allowed: lmc, llama-bench"):
        adapter_of("vllm")


def test_llama_bench_options_follow_the_config() -> None:
    opts = options(512, 128, LlamaBenchConfig("q8_0", 4, 7, 256, "q8_0", pg=True))
    pairs = dict(zip(opts[::2], opts[1::2], strict=True))
    assert pairs == {"-p": "512", "-n": "128", "-d": "256", "-r": "7", "-t": "4",
                     "-ctk": "q8_0", "-ctv": "q8_0", "-o": "json", "-pg": "512,128"}


SPEC = """
name = "mixed"
model = "{model}"
engines = {engines}
[[workload]]
kind = "{kind}"
ctx = 32
"""


@pytest.mark.parametrize(("engines", "kind", "section", "message"), [
    ('["lmc", "llama-bench"]', "ppl", "", "llama-bench runs decode workloads"),
    ('["lmc", "vllm"]', "decode", "", "key 'engines': unknown value 'vllm'"),
    ('["lmc"]', "decode", '[llama-bench]\ngguf_type = "f32"',
     "key 'llama-bench': the spec's `engines` does not list llama-bench"),
    ('["llama-bench"]', "decode", '[llama-bench]\nrev = "v1"', "key 'llama-bench.rev'"),
    ('["llama-bench"]', "decode", '[llama-bench]\ngguf_type = "q4_k"',
     "key 'llama-bench.gguf_type': unknown value 'q4_k'"),
    ('["llama-bench"]', "decode", '[llama-bench]\nrepetitions = 0',
     "key 'llama-bench.repetitions': must be >= 1"),
    ('["llama-bench"]', "decode", '[llama-bench]\nflash = true', "key 'llama-bench.flash'"),
    ('["llama-bench"]', "decode", '[llama-bench]\ncache_type = "f32"',
     "key 'llama-bench.cache_type': unknown value 'f32'"),
])
def test_spec_section_errors_name_the_key(engines: str, kind: str, section: str, message: str,
                                          needle_model: Path, tmp_path: Path) -> None:
    text = SPEC.format(model=needle_model, engines=engines, kind=kind) + section + "\n"
    if kind == "ppl":
        text = text.replace("ctx = 32", "length = 32")
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_spec(text, tmp_path / "spec.toml")


def test_spec_expands_llama_bench_cells_beside_lmc(needle_model: Path, tmp_path: Path) -> None:
    from harness.plan.matrix import Placement, expand

    text = SPEC.format(model=needle_model, engines='["lmc", "llama-bench"]', kind="decode") + \
        '[engine]\nwq = ["f32", "q8"]\n[llama-bench]\ngguf_type = ["f32", "q8_0"]\n' \
        'threads = [1, 2]\n'
    spec = parse_spec(text, tmp_path / "spec.toml")
    cells = expand(spec, [Placement("farm-x86", False, "x86_64", 2, ("farm-x86",))])
    engines = [c.engine for c in cells]
    assert engines.count("lmc") == 2 and engines.count("llama-bench") == 4
    llama = {(c.config.gguf_type, c.config.threads) for c in cells if c.engine == "llama-bench"}
    assert llama == {("f32", 1), ("f32", 2), ("q8_0", 1), ("q8_0", 2)}


def test_run_here_is_the_adapter_on_this_machine(lmc: Path, needle_model: Path,
                                                 tmp_path: Path) -> None:
    # what benches and studies call: ids on stdin, the checked document back, failures named
    ids = decode_prompt(needle_model, CTX, 0).ids
    doc = run_here(lmc, "generate", needle_model, ids, ["--max-new", "2", "--threads", "1"])
    assert doc["prompt_tokens"] == CTX and len(doc["tokens"]) == 2
    with pytest.raises(RunFailure, match=r"generate --model \S*missing .* failed \(exit 2\)"):
        run_here(lmc, "generate", tmp_path / "missing", ids, ["--max-new", "1"])
    # a prefix ending with the binary (as an emulator's): here a shell that prints no document
    with pytest.raises(RunFailure, match="output field 'schema'"):
        run_here(["sh", "-c", "echo '{}'", "sh", str(lmc)], "ppl", needle_model, ids)


def test_lmc_info_prints_the_vocabulary_the_harness_uses(lmc: Path, needle_model: Path,
                                                         tmp_path: Path) -> None:
    """One list of policies, switches and defaults: the engine's own table (``lmc info``) is the
    one the spec checker, the flags and the report labels read (db.lmc_axes)."""
    info = json.loads(subprocess.run([str(lmc), "info"], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    assert info["policies"] == list(lmc_axes.POLICY_NAMES)
    assert set(info["evicting"]) == set(lmc_axes.EVICTING)
    assert set(info["feature_policies"]) == set(lmc_axes.FEATURE_POLICIES)
    assert [(s["name"], s["flag"], s["default"], set(s["policies"])) for s in info["switches"]] \
        == [(s.name, s.flag, s.default, set(s.policies)) for s in lmc_axes.SWITCHES]
    assert info["defaults"] == lmc_axes.DEFAULTS
    # ... and the harness's users of the list take it as it is
    text = SPEC.format(model=needle_model, engines='["lmc"]', kind="attn-bench") + \
        "[engine.policy.nonesuch]\n"
    with pytest.raises(InputError, match="allowed: " + ", ".join(sorted(info["policies"]))):
        parse_spec(text, tmp_path / "spec.toml")
    labels = {s["flag"].removeprefix("--") for s in info["switches"]}
    assert labels == {s.label for s in lmc_axes.SWITCHES}


def test_the_ranked_budget_is_an_engine_axis_of_ppl_runs(tmp_path: Path) -> None:
    """engine.measure_keys_keep: each budget (% of keys kept) of lmc's lost_keep figure is a
    config of its own; 50 (lmc's default) leaves the config, and so the run keys, as they were
    before the axis existed; exact ranks no key and takes no budget."""
    from devices.checker import Checker
    from harness.engines.lmc.config import configs
    from harness.engines.lmc.section import parse_section

    check = Checker(tmp_path / "spec.toml", InputError, "spec")
    table = {"measure_keys": 8, "policy": {"exact": {}, "window": {}}}
    keeps = parse_section(check, table | {"measure_keys_keep": [25, 50]}, ["ppl"])
    found = {(c.policy, c.measure_keys_keep) for c in configs(keeps, "ppl", True, 1)}
    assert found == {("exact", None), ("window", 25), ("window", None)}
    before = [c.as_dict() for c in configs(parse_section(check, table, ["ppl"]), "ppl", True, 1)]
    at_half = [c.as_dict() for c in configs(keeps, "ppl", True, 1) if not c.measure_keys_keep]
    assert at_half == before
    with pytest.raises(InputError, match="measure_keys_keep"):
        parse_section(check, table | {"measure_keys_keep": 100}, ["ppl"])
    # the direct recall's candidate count: set, it is in the ranked configs only
    direct = parse_section(check, table | {"measure_keys_direct": 256}, ["ppl"])
    assert {(c.policy, c.as_dict().get("measure_keys_direct"))
            for c in configs(direct, "ppl", True, 1)} == {("exact", None), ("window", 256)}
    # reports tell the budgets' runs apart (a cell per config label)
    from reports.runs import config_label
    labels = {config_label({"policy": c.policy, "config": json.dumps(c.as_dict())})
              for c in configs(keeps, "ppl", True, 1) + configs(direct, "ppl", True, 1)}
    assert labels == {"exact", "window", "window ranked-keep=25%", "window direct=256"}


def test_bf16_acts_is_an_engine_axis_of_bf16_weights(tmp_path: Path) -> None:
    """engine.bf16_acts (lmc --bf16-acts): a config of its own with bf16 weights only, unset
    it leaves the config (and so the run keys) as before the axis; lmc gets the flag, reports
    a label of its own; without bf16 in engine.wq the spec is refused, naming the key."""
    from devices.checker import Checker
    from harness.engines.lmc.config import configs, count
    from harness.engines.lmc.run_options import options as lmc_options
    from harness.engines.lmc.section import parse_section
    from harness.workloads.kinds import WorkloadPoint
    from reports.runs import config_label

    check = Checker(tmp_path / "spec.toml", InputError, "spec")
    table = {"wq": ["f32", "bf16"], "policy": {"exact": {}}}
    axes = parse_section(check, table | {"bf16_acts": [False, True]}, ["decode"])
    found = configs(axes, "generate", True, 1)
    assert [(c.wq, c.bf16_acts) for c in found] == [("f32", None), ("bf16", None),
                                                   ("bf16", True)]
    assert count(axes, True) == len(found) == 3
    before = [c.as_dict() for c in configs(parse_section(check, table, ["decode"]),
                                           "generate", True, 1)]
    assert [c.as_dict() for c in found if not c.bf16_acts] == before
    point = WorkloadPoint("decode", (("max_new", 2),))
    flags = [lmc_options(point, c) for c in found]
    assert ["--bf16-acts" in f for f in flags] == [False, False, True]
    labels = [config_label({"policy": c.policy, "wq": c.wq, "config": json.dumps(c.as_dict())})
              for c in found]
    assert labels == ["exact", "exact wq=bf16", "exact wq=bf16 acts=bf16"]
    with pytest.raises(InputError, match=r"engine.bf16_acts.*add \"bf16\" to engine.wq"):
        parse_section(check, {"wq": "q8", "bf16_acts": True}, ["decode"])
