"""Spec validation: every error names the file, the key and what is allowed."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from devices.inventory import local_device
from harness import REPO_ROOT
from harness.errors import InputError
from harness.identity import WORKTREE
from harness.plan.matrix import expand, resolve_placements
from harness.spec import load_spec
from harness.workloads.needle import NEEDLE
from harness.workloads.text import DEFAULT_NEEDLE
from harness.workloads.tokenizer import load_tokenizer
from reports.stats import compare_samples, runs_needed

GOOD = """
name = "t1"
model = "model"
devices = ["local"]
repeats = 2

[engine]
kv = ["f32", "q8"]
threads = 1

[engine.policy.exact]
[engine.policy.sparse]
k = [1, 4, 32]

[[workload]]
kind = "needle"
ctx = [256, 512]
depth = [0.0, 0.5, 1.0]
seed = 3
max_new = 8
"""


@pytest.fixture()
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path


def write(spec_dir: Path, text: str) -> Path:
    path = spec_dir / "spec.toml"
    path.write_text(text)
    return path


def error_of(spec_dir: Path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load_spec(write(spec_dir, text))
    assert info.value.exit_code == 2
    message = str(info.value)
    assert str(spec_dir / "spec.toml") in message
    return message


def test_good_spec_is_parsed_with_defaults(spec_dir: Path) -> None:
    spec = load_spec(write(spec_dir, GOOD))
    assert spec.name == "t1"
    assert spec.model == (spec_dir / "model").resolve()
    assert spec.revisions == [WORKTREE]
    assert (spec.repeats, spec.warmups, spec.retries) == (2, 1, 2)
    assert [p.name for p in spec.axes("lmc").policies] == ["exact", "sparse"]
    sparse = spec.axes("lmc").policies[1]
    assert (sparse.k, sparse.block, sparse.probes) == ([1, 4, 32], [32], [8])
    assert spec.axes("lmc").threads == [1]
    needle = spec.workloads[0]
    assert needle.axes == {"ctx": [256, 512], "depth": [0.0, 0.5, 1.0], "seed": [3]}
    assert needle.settings == {"max_new": 8}
    assert len(spec.hash) == 64
    assert spec.confirm_budget_s == 0.0  # track confirms nothing unless asked
    assert spec.ends_only is False  # and measures every new commit


def test_track_section_sets_the_confirmation_budget_and_ends_only(spec_dir: Path) -> None:
    spec = load_spec(write(spec_dir, GOOD + "\n[track]\nconfirm_budget_s = 900\n"
                                             "ends_only = true\n"))
    assert spec.confirm_budget_s == 900.0 and spec.ends_only is True
    for section, allowed in (("confirm_budget_s = -1", ">= 0"),
                             ("confirm_budget_s = 1e9", "<= 86400"),
                             ('confirm_budget_s = "1h"', "number"),
                             ('ends_only = "yes"', "true or false"),
                             ("budget = 60", "allowed: confirm_budget_s, ends_only")):
        message = error_of(spec_dir, GOOD + f"\n[track]\n{section}\n")
        assert "'track." in message and allowed in message, message


def test_feature_policies_are_refused_with_attn_bench(spec_dir: Path) -> None:
    # h2o-prev scores keys from token features, which attn-bench's synthetic data lacks: the
    # spec says so when read, not each run when it fails on the board
    text = GOOD.replace("[engine.policy.sparse]", "[engine.policy.h2o-prev]").replace(
        "k = [1, 4, 32]", "k = [4]")
    load_spec(write(spec_dir, text))  # with needle workloads only it is fine
    bench = text + '\n[[workload]]\nkind = "attn-bench"\nctx = [256]\n'
    message = error_of(spec_dir, bench)
    assert "key 'engine.policy.h2o-prev'" in message and "attn-bench" in message


@pytest.mark.parametrize(
    ("old", "new", "key", "allowed"),
    [
        ('name = "t1"', 'name = "Bad Name"', "'name'", "[a-z0-9]"),
        ('model = "model"', 'model = "nowhere"', "'model'", "config.json"),
        ('kv = ["f32", "q8"]', 'kv = ["f16"]', "'engine.kv'", "allowed: f32, q8"),
        ("threads = 1", "threads = 0", "'engine.threads'", ">= 1"),
        ("threads = 1", 'threads = "two"', "'engine.threads'", "integer"),
        ("[engine.policy.exact]", "[engine.policy.exact]\nk = 4", "'engine.policy.exact.k'",
         "non-exact policies only"),
        ("[engine.policy.sparse]", "[engine.policy.fancy]", "'engine.policy.fancy'",
         "allowed: exact, gbm, h2o, h2o-prev, oracle, quest, random, sparse, window"),
        ("k = [1, 4, 32]", "k = [1, 1]", "'engine.policy.sparse.k'", "listed twice"),
        ("k = [1, 4, 32]", "topk = 4", "'engine.policy.sparse.topk'",
         "allowed: block, exact_first_layer, importance, k, kv_budget, probe_summary, probes, "
         "recency"),
        ('kind = "needle"', 'kind = "haystack"', "'workload[0].kind'",
         "allowed: needle, ppl, decode, attn-bench"),
        ("depth = [0.0, 0.5, 1.0]", "depth = [1.5]", "'workload[0].depth'", "<= 1"),
        ("ctx = [256, 512]", "", "'workload[0].ctx'", "required for needle"),
        ("max_new = 8", "max_new = 8\nlength = 3", "'workload[0].length'", "allowed: ctx"),
        ("repeats = 2", "repeats = 0", "'repeats'", ">= 1"),
        ("repeats = 2", "repeat = 2", "'repeat'", "allowed: backoff_s, cooldown_s"),
        ('devices = ["local"]', 'devices = ["a;rm -rf"]', "'devices'", "not a device or class"),
    ],
)
def test_invalid_specs_name_file_key_and_allowed(spec_dir: Path, old: str, new: str, key: str,
                                                 allowed: str) -> None:
    assert old in GOOD
    message = error_of(spec_dir, GOOD.replace(old, new))
    assert f"key {key}" in message
    assert allowed in message


def test_not_toml_and_missing_workload(spec_dir: Path) -> None:
    assert "not valid TOML" in error_of(spec_dir, "name = ")
    message = error_of(spec_dir, 'name = "x"\nmodel = "model"\n')
    assert "key 'workload'" in message and "needle" in message


def test_attn_bench_needs_no_model_but_checks_heads(spec_dir: Path) -> None:
    text = 'name = "ab"\n[[workload]]\nkind = "attn-bench"\nctx = [1024, 4096]\n'
    spec = load_spec(write(spec_dir, text))
    assert spec.model is None
    assert spec.workloads[0].axes["heads"] == [16]
    bad = text + "heads = 6\nkv_heads = 4\n"
    assert "multiple of kv_heads" in error_of(spec_dir, bad)


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "specs").glob("*.toml")),
                         ids=lambda p: p.name)
def test_shipped_specs_are_valid(path: Path) -> None:
    spec = load_spec(path)
    assert spec.workloads
    if spec.devices == ["local"]:
        cells = expand(spec, resolve_placements(spec, [local_device()]))
        assert cells
        if spec.name == "demo":  # 3 contexts x 3 depths x (exact + sparse k 1, 4, 8, 16, 32)
            assert len(cells) == 54 * spec.repeats
            # the demo must show what sparse attention buys: a context where even its largest k
            # attends to a fraction of the blocks, which the shipped model still recalls at
            sparse = [c for c in cells if c.config.policy == "sparse"]
            largest = max(c.config.k for c in sparse)
            fractions = [largest * c.config.block / dict(c.workload.params)["ctx"]
                         for c in sparse if c.config.k == largest]
            assert min(fractions) <= 0.5
            assert max(dict(c.workload.params)["ctx"] for c in cells) <= 2048


# The shipped specs that compare timings (devices, engines, policies or prompt lengths): each
# cell needs the runs a side with which the exact U test can decide, plus one so that a single
# run out of order does not leave a 1.5x difference undecided.
COMPARING = ("demo.toml", "farm_quickstart.toml", "x86_vs_arm.toml", "latency_sweep.toml",
             "lmc_vs_llamacpp.toml", "lmc_vs_llamacpp_depth4096.toml", "ttft_prefill.toml",
             "bf16_vs_llamacpp.toml")


@pytest.mark.parametrize("name", COMPARING)
def test_comparing_specs_have_the_repeats_a_comparison_needs(name: str) -> None:
    spec = load_spec(REPO_ROOT / "specs" / name)
    assert spec.repeats >= runs_needed() + 1, f"{name}: repeats = {spec.repeats}"
    # the exact test at that many runs a side separates two samples that do not overlap
    assert compare_samples([1.0 + i / 100 for i in range(spec.repeats)],
                           [1.5 + i / 100 for i in range(spec.repeats)]).verdict == "slower"


NEEDLE_SPECS = [path for path in sorted((REPO_ROOT / "specs").glob("*.toml"))
                if any(w.kind == "needle" for w in load_spec(path).workloads)]


@pytest.mark.parametrize("path", NEEDLE_SPECS, ids=lambda p: p.name)
def test_needle_specs_leave_room_for_the_answer(path: Path) -> None:
    """The model answers by restating the needle ("The secret code of Elena is 15955."): a
    max_new shorter than that statement cuts the value off and scores recall 0 for every
    config, exact attention included."""
    spec = load_spec(path)
    tokenizer = load_tokenizer(spec.model)
    for workload in (w for w in spec.workloads if w.kind == "needle"):
        max_new = workload.settings.get("max_new", NEEDLE.settings[0].default)
        for seed in workload.axes.get("seed", [0]):
            statement = DEFAULT_NEEDLE.needle_text(*DEFAULT_NEEDLE.draw(
                random.Random(f"needle/{seed}")))
            assert len(tokenizer.encode(statement)) + 1 <= max_new, (statement, max_new)


def test_cli_reports_spec_error_with_exit_code_2(spec_dir: Path) -> None:
    path = write(spec_dir, GOOD.replace('kv = ["f32", "q8"]', 'kv = "f64"'))
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "--db", f"sqlite:///{spec_dir}/x.db", "run",
         str(path)], capture_output=True, text=True, cwd=spec_dir, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "benchfarm: error:" in proc.stderr and "'engine.kv'" in proc.stderr
