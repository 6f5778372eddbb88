"""A report of an experiment with many engine revisions (a nightly one) shows its newest
revisions in full and follows every revision in its history, so that its size grows with what
it shows, not with the experiment's age; `--revisions all` shows every revision."""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path

import pandas as pd
from fixtures_reports import SyntheticExperiment, build_record

from db import Store
from harness.cli import main
from harness.commands.history import load_history
from harness.identity import commit_order
from reports.plots import Axes, Series, line_chart, spread_caption
from reports.render import render_report

REVISIONS = [f"rev-{i:02d}" for i in range(14)]  # in the order their runs were made
STEP_AT = 3  # decode slows down 2x from this revision on: older than the newest ten


def nightly(path: Path) -> Store:
    """Fourteen revisions, each with exact and sparse k=8 three times; a failed run in the
    oldest revision."""
    store = Store.open(f"sqlite:///{path}")
    exp = SyntheticExperiment(store, name="nightly", spec_text='name = "nightly"\n')
    for i, revision in enumerate(REVISIONS):
        exp.add_build(revision, build_record(source_hash=f"{i:064x}", revision=revision,
                                             binary_sha256=f"{i + 100:064x}"))
        slower = 2.0 if i >= STEP_AT else 1.0
        for k, repeat in itertools.product((None, 8), range(3)):
            exp.run(policy="exact" if k is None else "sparse", k=k, repeat=repeat,
                    build=revision, decode_ms=slower * (10.0 + 0.01 * repeat))
    exp.run(policy="sparse", k=2, status="failed", build=REVISIONS[0])
    return store


def csv(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO((out / f"{name}.csv").read_text()), keep_default_na=False)


def test_the_sections_show_the_newest_revisions_and_the_history_every_one(
        tmp_path: Path) -> None:
    store = nightly(tmp_path / "nightly.db")
    index = render_report(store, "nightly", tmp_path / "out")
    out = index.parent
    newest = REVISIONS[-10:]
    # the tables below the history: the newest ten revisions' cells only
    assert sorted(set(csv(out, "k_sweep")["revision"])) == newest
    for table in ("timings", "latency"):  # revisions apart in the config's label
        configs = csv(out, table)["config"]
        assert sorted({re.search(r"rev=(rev-\d+)", c)[1] for c in configs}) == newest, table
    assert csv(out, "failures").empty  # the failed run is in the oldest revision
    # every run is in runs.csv, and the manifest counts them all
    assert len(csv(out, "runs")) == 14 * 6 + 1
    markdown = (out / "report.md").read_text()
    assert f"{14 * 6 + 1} runs (1 failed, {14 * 6} ok)" in markdown
    assert sorted(set(csv(out, "builds")["revision"])) == REVISIONS
    # the history follows every revision: the step at rev-03 is found there
    steps = csv(out, "history_steps")
    assert set(steps["revision"]) == {REVISIONS[STEP_AT]} and (steps["ratio"] > 1.9).all()
    page = index.read_text()
    history = page.split('<section id="history">')[1].split("</section>")[0]
    assert ">rev-00<" in history and ">rev-12<" in history  # the timelines' axis labels
    # and the report says what it left out, first
    shown = page.split('<section id="revisions">')[1].split("</section>")[0]
    assert "newest 10 of the experiment&#x27;s 14 engine revisions (from rev-04 to rev-13)" \
        in shown
    assert markdown.index("## Revisions shown") < markdown.index("## History across revisions")
    store.close()


def test_commit_order_decides_which_revisions_are_newest(tmp_path: Path) -> None:
    store = nightly(tmp_path / "nightly.db")
    # git says the names' reverse order is the commit order: rev-13 is the oldest commit
    out = render_report(store, "nightly", tmp_path / "out", revisions=3,
                        revision_order=lambda revisions: sorted(revisions, reverse=True)).parent
    assert sorted(set(csv(out, "k_sweep")["revision"])) == ["rev-00", "rev-01", "rev-02"]
    assert len(csv(out, "failures")) == 1  # rev-00 is shown now, with its failed run
    store.close()


def test_every_revision_in_full_on_request(tmp_path: Path, capsys) -> None:
    store = nightly(tmp_path / "nightly.db")
    store.close()
    url = f"sqlite:///{tmp_path}/nightly.db"
    assert main(["--db", url, "report", "nightly", "--out", str(tmp_path / "all"),
                 "--revisions", "all"]) == 0
    assert sorted(set(csv(tmp_path / "all", "k_sweep")["revision"])) == REVISIONS
    assert "Revisions shown" not in (tmp_path / "all" / "report.md").read_text()
    assert main(["--db", url, "report", "nightly", "--out", str(tmp_path / "few"),
                 "--revisions", "2"]) == 0
    assert sorted(set(csv(tmp_path / "few", "k_sweep")["revision"])) == REVISIONS[-2:]
    capsys.readouterr()
    for bad in ("0", "-3", "some"):
        try:
            main(["--db", url, "report", "nightly", "--revisions", bad])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"--revisions {bad} was taken")
        assert f"'{bad}': give a number of revisions (1 or more) or all" in \
            capsys.readouterr().err


def test_an_experiment_within_the_count_is_shown_whole(tmp_path: Path) -> None:
    store = nightly(tmp_path / "nightly.db")
    whole = render_report(store, "nightly", tmp_path / "whole", revisions=None).parent
    counted = render_report(store, "nightly", tmp_path / "counted", revisions=14).parent
    for name in ("report.md", "index.html", "k_sweep.csv", "failures.csv", "manifest.json"):
        assert (whole / name).read_text() == (counted / name).read_text(), name
    store.close()


def test_a_long_timeline_draws_lines_and_a_band_not_a_marker_a_revision() -> None:
    """1,000 revisions put markers 0.2 px apart (a timeline was 236,000 circles and as many
    whiskers): past a marker's width apart the chart draws the line, and the spread as one
    band, and says so in its caption."""
    def chart(revisions: int) -> str:
        points = [(float(i), 10.0 + i % 7) for i in range(revisions)]
        spread = [(x, y - 1.0, y + 1.0) for x, y in points]
        return line_chart("t", [Series("a", points, spread=spread),
                                Series("b", [(x, y * 2) for x, y in points])],
                          Axes("revision", "ms"))

    few, many = chart(12), chart(1000)
    assert few.count("<circle") == 24 and few.count('class="spread"') == 12
    assert "spread-band" not in few and spread_caption(12) == " (whiskers: min-max over runs)"
    assert many.count("<circle") == 0 and 'class="spread"' not in many
    assert many.count('class="spread-band"') == 1  # series a's; b has no spread
    assert many.count('<polyline class="series"') == 2
    # the band runs up along the maxima and back along the minima: 2 points a revision
    band = re.search(r'class="spread-band" points="([^"]+)"', many)[1]
    assert len(band.split()) == 2000
    assert spread_caption(1000) == " (shaded: min-max over runs)"
    assert len(many) < 100_000


def test_revisions_git_does_not_know_are_ordered_by_their_first_run_everywhere(
        tmp_path: Path) -> None:
    """`benchfarm history`, the report's timelines and which revisions it shows in full agree:
    revisions outside the repository (here named against their order) follow their first run."""
    store = Store.open(f"sqlite:///{tmp_path}/named.db")
    exp = SyntheticExperiment(store, name="named", spec_text='name = "named"\n')
    names = ["zeta-rev", "alpha-rev", "mid-rev"]  # run in this order
    for i, revision in enumerate(names):
        exp.add_build(revision, build_record(source_hash=f"{i:064x}", revision=revision,
                                             binary_sha256=f"{i + 50:064x}"))
        for repeat in range(3):
            exp.run(repeat=repeat, build=revision, decode_ms=10.0 + i + 0.01 * repeat)
    history = load_history(store, "named", "decode_ms_per_token", None, None, 0.0)
    assert history.revisions == names
    out = render_report(store, "named", tmp_path / "out", revisions=2,
                        revision_order=commit_order).parent
    assert sorted(set(csv(out, "k_sweep")["revision"])) == sorted(names[1:])
    page = (out / "index.html").read_text()
    first_timeline = page.split('<section id="history">')[1].split("</svg>")[0]
    ticks = re.findall(r'<text x="[\d.]+" y="234"[^>]*>([^<]+)</text>', first_timeline)
    assert ticks == [name[:7] for name in names]  # the x axis, revision labels cut to 7
    store.close()
