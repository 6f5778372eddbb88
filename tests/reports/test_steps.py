"""The step detector (reports/steps.py) on synthetic series with known steps and on pure noise,
the history built from stored runs of several revisions (synthetic rows, the real store) and
the bisection's search (harness.history.bisect.search)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from fixtures_reports import SyntheticExperiment, build_record

from db import Store
from harness.history.bisect import search
from reports.history import history, revision_runs, timeline_figures
from reports.render import render_report
from reports.steps import StepParams, detect_steps, differs_beyond_noise


def noisy(levels: list[float], noise: float, repeats: int, seed: int,
          drift: float = 0.0) -> list[list[float]]:
    """Points at ``levels`` with log-normal run noise and AR(1) drift between revisions."""
    rng = np.random.default_rng(seed)
    points, wander = [], 0.0
    for level in levels:
        wander = drift * wander + rng.normal(0.0, noise) if drift else 0.0
        points.append([float(v) for v in level * np.exp(wander + rng.normal(0, noise, repeats))])
    return points


def drifting(length: int, rho: float, drift: float, noise: float, repeats: int,
             seed: int) -> list[list[float]]:
    """A flat series: AR(1) drift between revisions (correlation ``rho``, standard deviation
    ``drift``) and log-normal run noise, as bench/steps.py draws them."""
    rng = np.random.default_rng(seed)
    points, wander = [], rng.normal(0.0, drift)
    for _ in range(length):
        wander = rho * wander + rng.normal(0.0, drift * math.sqrt(1 - rho * rho))
        points.append([float(v) for v in np.exp(wander + rng.normal(0, noise, repeats))])
    return points


def test_one_step_is_found_at_its_revision_with_its_ratio() -> None:
    points = noisy([1.0] * 6 + [2.0] * 6, 0.03, 3, seed=1)
    steps = detect_steps(points)
    assert [s.index for s in steps] == [6]
    assert 1.85 < steps[0].ratio < 2.15 and 0.95 < steps[0].before < 1.05


def test_two_steps_up_and_down_are_both_found() -> None:
    points = noisy([1.0] * 5 + [3.0] * 4 + [1.5] * 5, 0.03, 3, seed=2)
    steps = detect_steps(points)
    assert [s.index for s in steps] == [5, 9]
    assert steps[0].ratio > 2.5 and steps[1].ratio < 0.6


def test_ten_steps_including_a_one_point_one_x_step_are_all_found_where_they_are() -> None:
    """No cap on the number of steps: ten in 110 revisions, 0.5x-2x, one of them 1.1x (and
    one 1 / 1.1x) on a quiet board (1 % run noise, 3 runs), each at its revision."""
    ratios = [1.5, 0.7, 1.1, 2.0, 0.5, 1.3, 1 / 1.1, 1.2, 0.8, 1.6]
    levels = [float(np.prod(ratios[:k])) for k in range(11) for _ in range(10)]
    for seed in range(3):
        steps = detect_steps(noisy(levels, 0.01, 3, seed=seed))
        assert [s.index for s in steps] == list(range(10, 110, 10))
        assert [round(s.ratio, 1) for s in steps] == [round(r, 1) for r in ratios]


def test_flat_noisy_series_give_no_step() -> None:
    """1-5 runs, 1-5 % run noise, no drift, 10-200 revisions: not one false step."""
    for seed, (length, noise, repeats) in enumerate([(10, 0.05, 1), (30, 0.03, 2),
                                                     (100, 0.02, 3), (200, 0.05, 5),
                                                     (60, 0.01, 4), (200, 0.04, 1)]):
        assert detect_steps(noisy([1.0] * length, noise, repeats, seed=seed)) == []


def test_pure_noise_gives_no_step_even_with_drift() -> None:
    found = [detect_steps(noisy([1.0] * 12, 0.05, 3, seed=seed, drift=0.5)) for seed in range(40)]
    assert sum(bool(f) for f in found) <= 2  # about 1 % of series (the module's text)


def test_ar1_drift_alone_makes_no_step() -> None:
    """Drift between revisions three times the run noise, strongly correlated (rho 0.8),
    wanders by 10 % and more over a history: it is no step."""
    for seed in range(6):
        points = drifting(150, rho=0.8, drift=0.03, noise=0.01, repeats=3, seed=seed)
        assert detect_steps(points) == []
    for seed in range(6):  # one run a revision: the drift is all the noise there is
        points = drifting(80, rho=0.6, drift=0.04, noise=0.02, repeats=1, seed=seed)
        assert detect_steps(points) == []


def test_a_single_outlying_run_moves_nothing() -> None:
    points = noisy([1.0] * 10, 0.02, 3, seed=3)
    points[4][1] = 5.0  # one run of one revision, five times slower
    assert detect_steps(points) == []
    for repeats in (1, 2):  # the revision's median is the outlier, or halfway to it
        points = noisy([1.0] * 30, 0.02, repeats, seed=5)
        points[12][0] = 3.0
        assert detect_steps(points) == []
    points = noisy([1.0] * 30, 0.02, 1, seed=6)
    points[12][0] = points[13][0] = 2.5  # two neighbouring revisions, each run once
    assert detect_steps(points) == []


def test_the_last_revision_is_a_step_of_its_own_when_its_runs_agree() -> None:
    """`track` reports a regression at the newest revision: with 3 runs that agree it is a
    step at once; run once, it cannot be told from an outlying run until the next revision."""
    for seed in range(3):
        assert [s.index for s in detect_steps(noisy([1.0] * 19 + [2.0], 0.02, 3, seed))] == [19]
        assert detect_steps(noisy([1.0] * 19 + [2.0], 0.02, 1, seed)) == []
        assert [s.index for s in detect_steps(noisy([1.0] * 18 + [2.0] * 2, 0.02, 1, seed))] \
            == [18]


def test_a_step_below_the_threshold_is_not_reported() -> None:
    points = noisy([1.0] * 6 + [1.04] * 6, 0.002, 3, seed=4)
    fine = StepParams(floor=0.001)  # a quiet board: noise floor 0.1 %
    assert detect_steps(points, fine) == []  # 4 %: real, but under the 5 % threshold
    assert [s.index for s in detect_steps(points, StepParams(threshold=0.02, floor=0.001))] == [6]
    points = noisy([1.0] * 6 + [1.015] * 6, 0.002, 3, seed=4)
    assert [s.index for s in detect_steps(points, StepParams(threshold=0.01, floor=0.001))] == [6]
    # 1.5 % over 6 revisions a side is 2.6 standard errors of the 1 % floor: within its reach
    assert detect_steps(points, StepParams(threshold=0.01)) == []


def test_two_revisions_with_repeats_and_single_points() -> None:
    assert [s.index for s in detect_steps([[1.0, 1.01, 0.99], [2.0, 2.02, 1.98]])] == [1]
    assert detect_steps([[1.0]]) == []
    assert detect_steps([[1.0, 1.3, 0.8], [1.1, 0.9, 1.2]]) == []  # within their own noise


def test_a_metric_with_values_at_or_below_zero_is_fitted_on_its_own_scale() -> None:
    rng = np.random.default_rng(0)
    points = [[float(v) for v in rng.normal(0.0 if i < 10 else 5.0, 0.5, 3)] for i in range(20)]
    steps = detect_steps(points)
    assert [s.index for s in steps] == [10] and 4.5 < steps[0].after - steps[0].before < 5.5


def test_differs_beyond_noise_takes_the_runs_noise() -> None:
    ratio, limit = differs_beyond_noise([[10.0, 10.1, 9.9]], [[20.0, 20.2, 19.8]])
    assert abs(ratio - 2.0) < 1e-9 and limit == 0.05
    ratio, limit = differs_beyond_noise([[10.0, 14.0, 7.0]], [[11.0, 15.0, 8.0]])
    assert limit > 0.5 > ratio - 1.0  # noisy runs: a 10 % change is within the noise


def test_history_from_stored_revisions_names_the_commit_of_the_step(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/history.db")
    exp = SyntheticExperiment(store)
    revisions = [str(i) * 40 for i in range(1, 6)]
    for i, revision in enumerate(revisions):
        exp.add_build(revision, build_record(source_hash=f"{i:064x}", revision=revision,
                                             binary_sha256=f"{i + 10:064x}"))
        for repeat in range(3):
            slow = 3.0 if i >= 3 else 1.0
            exp.run(policy="exact", repeat=repeat, build=revision,
                    decode_ms=10.0 * slow * (1 + 0.01 * repeat))
            exp.run(policy="sparse", k=4, repeat=repeat, build=revision,
                    decode_ms=5.0 * (1 + 0.01 * repeat))
    runs = revision_runs(store, "synthetic")
    order = list(reversed(revisions))  # the commit order comes from the caller (git)
    result = history(runs, list(revisions), "decode_ms_per_token")
    assert [(s.config, len(s.points)) for s in result.series] == [
        ("needle ctx=256 depth=0.5 seed=0 exact t=2", 5),
        ("needle ctx=256 depth=0.5 seed=0 sparse k=4 t=2", 5)]
    assert [(s.revision, s.config.split()[-2]) for s in result.steps] == [(revisions[3], "exact")]
    assert 2.9 < result.steps[0].ratio < 3.1 and result.steps[0].regression
    document = result.document()
    assert document["series"][0]["points"][0]["n"] == 3
    assert set(document["steps"][0]) >= {"revision", "device", "config", "before", "after",
                                         "ratio"}
    backwards = history(runs, order, "decode_ms_per_token")  # another order, another step
    assert [s.revision for s in backwards.steps] == [revisions[2]]
    assert not backwards.steps[0].regression
    svg = timeline_figures(result)[0][1]
    assert svg.count('class="mark"') == 1 and svg.count('class="series"') == 2

    # the report: a timeline per metric and device, the steps' table, no cell pools revisions
    index = render_report(store, "synthetic", tmp_path / "report",
                          revision_order=lambda revs: list(revisions))
    html = index.read_text()
    assert "History across revisions" in html and html.count('class="mark"') >= 1
    steps = (tmp_path / "report" / "history_steps.csv").read_text().splitlines()
    assert len(steps) == 2 and steps[1].startswith(revisions[3])  # header + the one step
    timings = [line for line in (tmp_path / "report" / "timings.csv").read_text().splitlines()
               if ",exact t=2 rev=" in line]
    assert len(timings) == 5 and all(",3,0," in line for line in timings)  # 3 runs a cell
    store.close()


def test_bisect_search_halves_and_steps_around_what_does_not_build() -> None:
    """harness.history.bisect.search: the first bad of 9 candidates (the last one bad) in at
    most ceil(log2 9) tests; an untestable candidate is skipped like `git bisect skip`."""
    for first in range(9):
        asked: list[int] = []

        def bad_from(i: int, first: int = first, asked: list[int] = asked) -> bool:
            asked.append(i)
            return i >= first

        assert search(9, bad_from) == (first, [first])
        assert len(asked) <= math.ceil(math.log2(9)) and len(set(asked)) == len(asked)

    asked = []

    def broken_at_3(i: int) -> bool | None:
        asked.append(i)
        return None if i == 3 else i >= 5

    assert search(9, broken_at_3) == (5, [5])
    assert 3 in asked and asked.count(3) == 1
    # only untestable commits between the last good and the first bad: it may be any of them
    assert search(9, lambda i: None if i in (3, 4) else i >= 4) == (5, [3, 4, 5])


def test_no_step_at_a_revision_with_its_predecessors_code_and_shared_binaries_show_at_each_name(
        tmp_path: Path) -> None:
    """A revision whose sources differ from its predecessor's only in comments (the same code
    hash, another binary) is the same engine: what moved there is noise, not a step. Two
    revisions that build one binary (one build row) each show its runs."""
    store = Store.open(f"sqlite:///{tmp_path}/code.db")
    exp = SyntheticExperiment(store)
    revisions = [str(i) * 40 for i in range(1, 6)]
    for i, revision in enumerate(revisions):
        code = "same" if i >= 2 else f"code-{i}"  # revisions 2, 3 and 4 differ in comments
        exp.add_build(revision, build_record(source_hash=f"{i:064x}", revision=revision,
                                             binary_sha256=f"{i + 10:064x}",
                                             extra={"code_hash": code}))
        for repeat in range(3):
            exp.run(policy="exact", repeat=repeat, build=revision,
                    decode_ms=10.0 * (3.0 if i >= 3 else 1.0) * (1 + 0.01 * repeat))
    runs = revision_runs(store, "synthetic")
    assert history(runs, revisions, "decode_ms_per_token").steps == []
    # the same values where revision 3 changes the code: the step is there
    exp.add_build("other", build_record(source_hash=f"{3:064x}", revision=revisions[3],
                                        binary_sha256=f"{13:064x}",
                                        extra={"code_hash": "changed"}))
    moved = history(revision_runs(store, "synthetic"), revisions, "decode_ms_per_token")
    assert [s.revision for s in moved.steps] == [revisions[3]]

    # a sixth revision that builds revision 0's binary: its own point, with those runs
    sixth = "6" * 40
    exp.add_build(sixth, build_record(source_hash=f"{0:064x}", revision=sixth,
                                      binary_sha256=f"{10:064x}", extra={"code_hash": "code-0"}))
    shown = history(revision_runs(store, "synthetic"), [*revisions, sixth],
                    "decode_ms_per_token")
    points = {p.revision: p.values for p in shown.series[0].points}
    assert list(points) == [*revisions, sixth] and points[sixth] == points[revisions[0]]
    store.close()
