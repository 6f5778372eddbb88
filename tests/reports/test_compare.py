"""compare: significance on synthetic samples, A/A noise floor, token identity, bad sides."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures_reports import SyntheticExperiment, build_record, healthy_fingerprint

from db import Store
from harness import ENGINE_DIR
from harness.commands.compare import revision_names
from harness.engines.lmc.build import source_hash
from harness.identity import git_output
from reports.aggregate import devices_table, timing_table
from reports.compare import compare, load_runs, terminal_table, write_comparison
from reports.errors import ReportInputError
from reports.runs import load_experiment
from reports.stats import (
    compare_samples,
    geometric_mean_ci,
    median,
    min_p_value,
    series_mean,
    series_median,
    summarize,
)


def test_clearly_different_samples_are_flagged() -> None:
    a = [10.0, 10.1, 9.9, 10.2, 10.0, 9.8]
    b = [12.0, 12.2, 11.9, 12.1, 12.3, 11.8]
    change = compare_samples(a, b)
    assert change.verdict == "slower"
    assert change.ratio == pytest.approx(12.05 / 10.0)
    assert change.p_value is not None and change.p_value < 0.01
    assert compare_samples(b, a).verdict == "faster"


def test_identical_distributions_are_not_flagged() -> None:
    a = [10.0, 10.3, 9.9, 10.1, 10.2, 9.8]
    b = [10.1, 9.9, 10.2, 10.0, 9.8, 10.3]
    change = compare_samples(a, b)
    assert change.verdict == "unchanged"
    assert change.p_value is not None and change.p_value > 0.5


def test_significant_but_tiny_change_is_unchanged() -> None:
    a = [10.00, 10.01, 10.02, 10.03, 10.04, 10.05]
    b = [10.10, 10.11, 10.12, 10.13, 10.14, 10.15]  # +1 %: real, but under the 5 % threshold
    change = compare_samples(a, b)
    assert change.verdict == "unchanged" and change.p_value < 0.05


def test_too_few_runs_are_inconclusive_without_a_p_value() -> None:
    assert min_p_value(3, 3) > 0.05 and min_p_value(4, 4) < 0.05
    change = compare_samples([1.0, 1.1, 1.2], [5.0, 5.1, 5.2])
    assert (change.verdict, change.p_value, change.needed) == ("inconclusive", None, 4)
    one = compare_samples([1.0], [2.0])  # repeats = 1: one run a side
    assert (one.verdict, one.p_value, one.ratio) == ("inconclusive", None, 2.0)


def seeded_runs(rng: np.random.Generator, n: int, median_ms: float) -> list[float]:
    """n independent runs' decode timings: log-normal around median_ms with a 10 % spread,
    the shape of repeated runs on a shared host."""
    return (median_ms * rng.lognormal(0.0, 0.1, n)).tolist()


def test_a_several_fold_slowdown_is_found_with_repeats() -> None:
    """What test_compare_farm's emulated board shows, on seeded samples: 8 runs against 4 of a
    board three times slower are significant and slower; one run a side decides nothing."""
    rng = np.random.default_rng(7)
    found = [compare_samples(seeded_runs(rng, 8, 1.0), seeded_runs(rng, 4, 3.0))
             for _ in range(200)]
    assert all(c.verdict == "slower" and c.p_value < 0.05 and c.ratio > 2 for c in found)
    once = compare_samples(seeded_runs(rng, 1, 1.0), seeded_runs(rng, 1, 3.0))
    assert (once.verdict, once.p_value) == ("inconclusive", None)


def test_aa_false_positive_rate_is_the_exact_tests_by_design() -> None:
    """A/A: both halves drawn from one distribution. With 4 runs a side and no threshold the
    exact U test flags exactly the draws that separate perfectly, 2 of the 70 rank orders
    (p = 2/70 < alpha): about 1 in 35, as designed. A change threshold beyond the spread of
    the medians flags none. Seeded: the same draws every time."""
    rng = np.random.default_rng(11)
    draws = [(seeded_runs(rng, 4, 1.0), seeded_runs(rng, 4, 1.0)) for _ in range(2000)]
    flagged = [compare_samples(a, b, threshold=0.0).verdict != "unchanged" for a, b in draws]
    assert 0.015 < sum(flagged) / len(draws) < 0.045  # 2/70 = 0.029
    assert min_p_value(4, 4) == pytest.approx(2 / 70)
    wide = [compare_samples(a, b, threshold=0.5).verdict for a, b in draws]
    assert set(wide) == {"unchanged"}


def test_geometric_mean_with_a_bootstrap_interval() -> None:
    same = geometric_mean_ci([2.0, 2.0, 2.0])
    assert (same.value, same.low, same.high, same.n) == (pytest.approx(2.0),) * 3 + (3,)
    spread = geometric_mean_ci([1.0, 4.0, None, float("nan")])
    assert spread.value == pytest.approx(2.0) and 1.0 <= spread.low < 2.0 < spread.high <= 4.0
    assert geometric_mean_ci([1.0, 4.0]) == spread  # a fixed seed: reports reproduce
    assert geometric_mean_ci([]) is None and "one config" in geometric_mean_ci([1.5]).text()


def test_median_is_numpys_bit_for_bit() -> None:
    """stats.median (the reports' loops call it per point) gives numpy.median's very float."""
    rng = np.random.default_rng(3)
    for n in range(1, 40):
        for values in (rng.lognormal(size=n), rng.integers(0, 4, size=n) * 0.1,
                       rng.normal(scale=1e-300, size=n), np.full(n, 1e308)):
            with np.errstate(over="ignore"):  # 1e308 + 1e308: inf, in both
                assert median(values.tolist()) == float(np.median(values))
    assert math.isinf(median([1e308, 1e308, float("inf"), 1.0]))


def test_series_mean_and_median_are_pandas_bit_for_bit() -> None:
    """The report's cells reduce column lists instead of a Series each: the same floats."""
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 7, 8, 9, 16, 100, 129, 1000):
        values = rng.lognormal(size=n) * rng.choice([1e-3, 1.0, 1e6], size=n)
        values[rng.random(n) < 0.2] = np.nan
        series = pd.Series(values)
        assert series_mean(values) == series.mean() or (math.isnan(series_mean(values))
                                                         and math.isnan(series.mean()))
        assert series_median(values.tolist()) == series.median() or (
            math.isnan(series.median()) and math.isnan(series_median(values.tolist())))
    assert math.isnan(series_mean(np.array([np.nan]))) and math.isnan(series_median([None]))


def test_summary_median_min_max_cv() -> None:
    summary = summarize([1.0, 2.0, 3.0, None, float("nan")])
    assert (summary.n, summary.median, summary.min, summary.max) == (3, 2.0, 1.0, 3.0)
    assert summary.cv == pytest.approx(0.5) and summary.noisy
    assert summary.text() == "2.00 [1.00, 3.00]"


@pytest.fixture
def farm_rows(tmp_path: Path) -> Store:
    """x86 `local` against an `arm` board: arm 2x slower on exact, diverging tokens on k=1."""
    store = Store.open(f"sqlite:///{tmp_path}/cmp.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm", arch="aarch64", cls="rk3588")
    exp.add_build("arm", build_record(binary_sha256="f" * 64, target="aarch64"))
    for repeat in range(6):
        jitter = 0.05 * (repeat % 3)
        exp.run(policy="exact", repeat=repeat, decode_ms=10.0 + jitter)
        exp.run(device="arm", build="arm", policy="exact", repeat=repeat, decode_ms=20.0 + jitter,
                threads=4)
        exp.run(policy="sparse", k=1, repeat=repeat, decode_ms=5.0 + jitter, tokens=[1, 2, 3])
        exp.run(device="arm", build="arm", policy="sparse", k=1, repeat=repeat, threads=4,
                decode_ms=5.0 + jitter, tokens=[1, 2, 4])
    yield store
    store.close()


def test_compare_devices(farm_rows: Store, tmp_path: Path) -> None:
    result = compare(farm_rows, "local", "arm")
    table = result.table.set_index("config")
    assert list(table.index) == ["exact", "sparse k=1"]  # thread counts differ: not in the key
    assert table.loc["exact", "change"] == "slower"
    assert table.loc["exact", "ratio"] == pytest.approx(2.0, rel=0.01)
    assert table.loc["exact", "tokens"] == "identical"
    assert table.loc["sparse k=1", "change"] == "unchanged"
    assert table.loc["sparse k=1", "tokens"] == "diverge at step 2"
    assert result.noise_floor is not None and result.noise_floor < 0.05
    summary = result.summary()
    assert "decode_ms_per_token in ms per token" in summary and "2 common configs" in summary
    assert "geometric mean 1.41" in summary  # sqrt(2.0 * 1.0)
    assert "0 faster, 1 slower, 1 unchanged, 0 inconclusive" in summary
    rollups = result.rollups().set_index(["by", "value"])
    assert rollups.loc[("policy", "exact"), "geomean"] == pytest.approx(2.0, rel=0.01)
    assert rollups.loc[("policy", "sparse"), "unchanged"] == 1
    assert rollups.loc[("device pair", "local -> arm"), "configs"] == 2
    text = terminal_table(result)
    assert text.startswith(summary) and "A/A noise floor" in text  # the summary leads
    html = write_comparison(result, tmp_path / "cmp")
    assert "<table" in html.read_text() and (tmp_path / "cmp" / "compare.csv").is_file()
    assert (tmp_path / "cmp" / "compare_summary.csv").is_file()

    by_class = compare(farm_rows, "x86", "rk3588")
    assert by_class.table["change"].tolist() == ["slower", "unchanged"]


def test_aa_mode_measures_the_noise_floor(farm_rows: Store) -> None:
    result = compare(farm_rows, "local", "local")
    assert len(result.table) == 2  # even vs odd repeats of each config
    assert set(result.table["change"]) <= {"unchanged", "inconclusive"}
    assert result.noise_floor == pytest.approx(max(abs(r - 1) for r in result.table["ratio"]))


def test_compare_revisions_pairs_on_the_same_device(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/rev.db")
    exp = SyntheticExperiment(store)
    exp.add_build("new", build_record(source_hash="b" * 64, revision="rev-b",
                                      binary_sha256="d" * 64))
    for repeat in range(5):
        exp.run(policy="exact", repeat=repeat, decode_ms=10.0 + 0.01 * repeat)
        exp.run(policy="exact", repeat=repeat, decode_ms=8.0 + 0.01 * repeat, build="new",
                seed=0, depth=0.5)
    result = compare(store, "rev-a", "rev-b")
    assert result.a.kind == "revision"
    assert result.table["change"].tolist() == ["faster"]
    assert result.table["device"].tolist() == ["local"]
    store.close()


def test_across_engines_lmc_runs_exact_unless_told_which_policy(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/engines.db")
    exp = SyntheticExperiment(store)
    for repeat in range(3):
        exp.run(kind="decode", policy="exact", repeat=repeat, decode_ms=10.0)
        exp.run(kind="decode", policy="sparse", k=4, repeat=repeat, decode_ms=5.0)
        exp.run(kind="decode", policy=None, engine="llama-bench", repeat=repeat, decode_ms=20.0)
    exact = compare(store, "lmc", "llama-bench").table
    sparse = compare(store, "lmc", "llama-bench", lmc_policy="sparse").table
    # a policy with no lmc runs (a typo, or not in these experiments) is named, not 0 configs
    with pytest.raises(ReportInputError, match="'sparce'.*stored policies: exact, sparse"):
        compare(store, "lmc", "llama-bench", lmc_policy="sparce")
    store.close()
    assert exact["median_a"].tolist() == [10.0] and exact["median_b"].tolist() == [20.0]
    assert sparse["median_a"].tolist() == [5.0] and sparse["median_b"].tolist() == [20.0]
    assert sparse["ratio"].iloc[0] == pytest.approx(exact["ratio"].iloc[0] * 2)


def test_boards_against_boards_read_only_their_runs(tmp_path: Path) -> None:
    """compare BOARD BOARD reads the two boards' measurements only; an experiment that has
    none of them is named."""
    store = Store.open(f"sqlite:///{tmp_path}/boards.db")
    both = SyntheticExperiment(store, name="both", spec_text='name = "both"\n')
    other = SyntheticExperiment(store, name="other", spec_text='name = "other"\n')
    for repeat in range(4):
        both.run(device="local", repeat=repeat, decode_ms=10.0)
        both.run(device="arm", repeat=repeat, decode_ms=20.0)
        both.run(device="board-3", repeat=repeat, decode_ms=40.0)
        other.run(device="board-3", repeat=repeat, decode_ms=40.0)
    assert set(load_runs(store, None, sides=("local", "arm"))["device"]) == {"local", "arm"}
    assert set(load_runs(store, None, sides=("local", "lmc"))["device"]) == \
        {"local", "arm", "board-3"}  # an engine on one side: every board's runs
    result = compare(store, "local", "arm")
    assert result.experiments == ["both"]
    assert result.table["median_b"].tolist() == [20.0]
    with pytest.raises(ReportInputError, match="no stored run of other was measured on "
                                               "'local' or 'arm'"):
        compare(store, "local", "arm", experiments=["other"])
    # a side that is no board reads every run of the experiments, as before
    with pytest.raises(ReportInputError, match="'nowhere' is neither a device.*board-3"):
        compare(store, "local", "nowhere", experiments=["both"])
    store.close()


def test_across_engines_lmc_configs_stay_apart_each_against_the_other_engine(
        tmp_path: Path) -> None:
    """lmc with and without --bf16-acts (or sparse at two k) against one llama-bench: a row
    each, never one cell pooling two lmc configs."""
    store = Store.open(f"sqlite:///{tmp_path}/engines.db")
    exp = SyntheticExperiment(store)
    for repeat in range(4):
        exp.run(kind="decode", policy="exact", repeat=repeat, decode_ms=10.0)
        exp.run(kind="decode", policy="exact", repeat=repeat, decode_ms=8.0,
                switches={"bf16_acts": True})
        for k, ms in ((4, 5.0), (8, 6.0)):
            exp.run(kind="decode", policy="sparse", k=k, repeat=repeat, decode_ms=ms)
        exp.run(kind="decode", policy=None, engine="llama-bench", repeat=repeat, decode_ms=20.0)
    exact = compare(store, "lmc", "llama-bench").table.set_index("config")
    sparse = compare(store, "lmc", "llama-bench", lmc_policy="sparse").table.set_index("config")
    store.close()
    assert exact["median_a"].to_dict() == {"wq=f32 t=2": 10.0, "wq=f32 acts=bf16 t=2": 8.0}
    assert exact["median_b"].tolist() == [20.0, 20.0] and exact["n_b"].tolist() == [4, 4]
    assert exact["n_a"].tolist() == [4, 4]
    assert sparse["median_a"].to_dict() == {"wq=f32 k=4 t=2": 5.0, "wq=f32 k=8 t=2": 6.0}


def on_cpu(model: str, cpu_id: str) -> dict:
    return healthy_fingerprint() | {"cpu_model": model, "cpu_id": cpu_id}


XEON = on_cpu("Intel(R) Xeon(R) Processor", "vendor GenuineIntel family 6 model 167 stepping 1")
EPYC = on_cpu("AMD EPYC 7B13", "vendor AuthenticAMD family 25 model 1 stepping 0")


def test_figures_from_different_cpu_models_are_flagged(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/cpus.db")
    exp = SyntheticExperiment(store)
    exp.add_build("new", build_record(source_hash="b" * 64, revision="rev-b",
                                      binary_sha256="d" * 64))
    for repeat in range(4):  # one device name, but the host under it changed between builds
        exp.run(policy="exact", repeat=repeat, decode_ms=10.0, fingerprint=XEON)
        exp.run(policy="exact", repeat=repeat, decode_ms=8.0, build="new", fingerprint=EPYC)
        exp.run(policy="sparse", k=4, repeat=repeat, decode_ms=6.0,
                fingerprint=XEON if repeat % 2 else EPYC)
        exp.run(policy="sparse", k=4, repeat=repeat, decode_ms=5.0, build="new",
                fingerprint=XEON)
    flags = compare(store, "rev-a", "rev-b").table.set_index("config")["flags"]
    assert "A and B ran on different CPUs" in flags["exact"]
    assert "AMD EPYC 7B13 (vendor AuthenticAMD family 25" in flags["exact"]
    assert flags["sparse k=4"].startswith("A: mixed CPU models")  # one side's runs are mixed
    assert "different CPUs" not in flags["sparse k=4"]

    runs = load_experiment(store, "synthetic").runs
    timings = timing_table(runs).set_index("config")["flags"]
    # revisions are cells of their own: exact ran on one CPU per revision, sparse at rev-a on two
    assert "mixed CPU models" not in timings["exact t=2 rev=rev-a"]
    assert "mixed CPU models" in timings["sparse k=4 t=2 rev=rev-a"]
    device = devices_table(runs, load_experiment(store, "synthetic").device_fingerprints).iloc[0]
    assert "mixed CPU models" in device["flags"] and "AMD EPYC" in device["cpu"]
    store.close()


def test_one_cpu_model_is_not_flagged(farm_rows: Store) -> None:
    table = compare(farm_rows, "rev-a", "rev-a").table
    assert not table["flags"].str.contains("CPU").any()


def test_unknown_or_mismatched_sides_are_input_errors(farm_rows: Store) -> None:
    with pytest.raises(ReportInputError, match="'nope' is neither a device"):
        compare(farm_rows, "local", "nope")
    with pytest.raises(ReportInputError, match="is a device but"):
        compare(farm_rows, "local", "rk3588")


def test_compare_reads_the_experiments_that_hold_its_sides(farm_rows: Store) -> None:
    """Without --experiment, compare reads the experiments holding runs of its sides (a board,
    a class, an engine, a revision by a prefix of 4 characters or more), not every one."""
    elsewhere = SyntheticExperiment(farm_rows, name="elsewhere", spec_text='name = "e"\n')
    elsewhere.add_device("orin", arch="aarch64", cls="jetson")
    elsewhere.add_build("cafe", build_record(revision="cafe1234", binary_sha256="e" * 64))
    elsewhere.run(device="orin", build="cafe")
    measuring = farm_rows.experiments_measuring
    assert measuring(["local", "arm"]) == ["synthetic"]
    assert measuring(["rk3588"]) == ["synthetic"] and measuring(["jetson"]) == ["elsewhere"]
    assert measuring(["cafe"]) == ["elsewhere"] and measuring(["caf"]) == []
    assert measuring(["lmc"]) == ["elsewhere", "synthetic"]
    assert compare(farm_rows, "local", "arm").table["n_a"].sum() == 12  # synthetic's alone
    with pytest.raises(ReportInputError, match="no stored run was measured on, by or at"):
        compare(farm_rows, "nope", "nada")


def test_a_run_in_two_experiments_counts_once(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/two.db")
    first = SyntheticExperiment(store, name="first")
    for repeat in range(8):
        first.run(policy="exact", repeat=repeat, decode_ms=10.0 + repeat)
    second = SyntheticExperiment(store, name="second", spec_text='name = "second"\n')
    assert store.link_runs(second.experiment_id, [f"first-{i}" for i in range(1, 9)]) == set()
    assert len(store.frames("second")["runs"]) == 8
    result = compare(store, "local", "local")  # A/A over both experiments
    assert result.table[["n_a", "n_b"]].values.tolist() == [[4, 4]]
    store.close()


def test_revisions_by_git_name_and_worktree(tmp_path: Path) -> None:
    """`compare HEAD~2 worktree`: git names resolve to commits, worktree to the working tree's
    engine sources; the sides say what they named."""
    head = git_output("rev-parse", "HEAD")
    worktree = source_hash(ENGINE_DIR)
    store = Store.open(f"sqlite:///{tmp_path}/named.db")
    exp = SyntheticExperiment(store)
    exp.add_build("head", build_record(source_hash="b" * 64, revision=head,
                                       binary_sha256="d" * 64))
    exp.add_build("tree", build_record(source_hash=worktree, revision=head + "+dirty",
                                       binary_sha256="f" * 64))
    for repeat in range(4):
        exp.run(policy="exact", repeat=repeat, decode_ms=10.0, build="head")
        exp.run(policy="exact", repeat=repeat, decode_ms=20.0, build="tree")
    named = revision_names("HEAD", "worktree", "local")
    assert named == {"HEAD": head, "worktree": worktree}  # `local` names no revision
    result = compare(store, "HEAD", "worktree", named=named)
    assert (result.a.kind, result.a.text) == ("revision", f"HEAD ({head[:12]})")
    assert result.table["ratio"].tolist() == [2.0] and result.table["change"].tolist() == ["slower"]
    store.close()


def test_flags_every_row_carries_are_said_once(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/flags.db")
    exp = SyntheticExperiment(store)
    exp.add_device("qemu", arch="aarch64", cls="rk3588", emulated=True)
    for repeat in range(4):
        for k in (None, 2, 4):
            policy = "exact" if k is None else "sparse"
            exp.run(policy=policy, k=k, repeat=repeat, decode_ms=10.0 + 0.1 * repeat)
            exp.run(device="qemu", policy=policy, k=k, repeat=repeat,
                    decode_ms=30.0 + 0.1 * repeat)
    result = compare(store, "local", "qemu")
    store.close()
    assert result.common_flags == ["B: emulated"] and set(result.table["flags"]) == {""}
    assert result.summary().count("emulated") == 1 and "every row: B: emulated" in \
        result.summary()
    assert "3 slower" in result.summary() and "geometric mean 2.970x" in result.summary()
