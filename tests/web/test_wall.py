"""The dashboard as a lab's wall screen, in a real headless Chromium over a real SQLite store:
the report's charts on an experiment page are drawn to scale while a job runs (the page's
own CSS once drew every bar as a 220 x 12 px strip)."""

from __future__ import annotations

from pathlib import Path

from fixtures_reports import SyntheticExperiment, build_record
from fixtures_web import serving
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait
from test_web import browser, chromium, console_errors, farm_store, get, get_json, text_of  # noqa: F401

from db.store import Store
from harness.identity import git_output
from reports.plots import Axes, Mark, Series, line_chart, stacked_bars

# Every report bar's rendered box against the size its attributes give it, scaled as its
# SVG is drawn; and the job's progress bars' boxes.
GEOMETRY = """
const bars = [];
for (const rect of document.querySelectorAll("#report svg.plot rect.bar")) {
  const svg = rect.ownerSVGElement, drawn = svg.getBoundingClientRect();
  const scale = drawn.width / svg.viewBox.baseVal.width;
  const box = rect.getBoundingClientRect();
  bars.push({width: box.width, height: box.height,
             wantWidth: rect.width.baseVal.value * scale,
             wantHeight: rect.height.baseVal.value * scale});
}
const progress = [...document.querySelectorAll("#job span.progress-bar")].map(
  (bar) => bar.getBoundingClientRect().width);
return {bars, progress};
"""


def running_experiment(url: str) -> None:
    """Runs of two configs at two context lengths (bars of four heights), and a job still
    running: its lease held, two of its six runs to go."""
    store = Store.open(url)
    exp = SyntheticExperiment(store, name="wall", spec_text='name = "wall"\n')
    for ctx, slow in ((256, 1.0), (1024, 3.0)):
        for repeat in range(2):
            exp.run(ctx=ctx, repeat=repeat, decode_ms=10.0 * slow, attn_ms=4.0 * slow)
            exp.run(ctx=ctx, repeat=repeat, policy="sparse", k=8, decode_ms=7.0 * slow,
                    attn_ms=1.0 * slow)
    job = store.jobs.add("wall", "wall.toml", exp.spec_text, owner="ana", priority=1,
                         holder="host:1:abc")
    store.jobs.set_totals(job, {"local": 10})
    store.leases.acquire("local", "host:1:abc", 600, experiment="wall", run_key="wall-9")
    store.close()


def test_an_experiment_page_during_a_running_job_draws_its_bars_to_scale(
        tmp_path: Path, browser: webdriver.Chrome) -> None:  # noqa: F811
    url = f"sqlite:///{tmp_path}/wall.db"
    running_experiment(url)
    with serving(url) as base:
        browser.get(base + "/experiments/wall")
        WebDriverWait(browser, 60).until(
            lambda d: d.execute_script("return document.readyState") == "complete")
        found = browser.execute_script(GEOMETRY)
        browser.save_screenshot(str(tmp_path / "experiment-running.png"))
        errors = console_errors(browser)
    bars = found["bars"]
    assert len(bars) == 8, found  # 2 contexts x 2 configs x (attention, rest)
    for bar in bars:
        assert abs(bar["width"] - bar["wantWidth"]) < 0.5, bar
        assert abs(bar["height"] - bar["wantHeight"]) < 0.5, bar
    # drawn to their values, not as strips of one size
    assert len({round(bar["height"]) for bar in bars}) >= 4
    assert max(bar["width"] for bar in bars) < 30
    assert found["progress"] and all(abs(w - 222) < 1 for w in found["progress"])  # + border
    assert errors == []


def wall_store(url: str) -> None:
    """farm_store's boards and running job of ana's, and a queued job of bo's that says why it
    waits."""
    store, _ = farm_store(url)
    queued = store.jobs.add("beta", "beta.toml", 'name = "beta"\n', owner="bo", priority=5)
    why = "arm-1 is reserved by bo until 18:00"  # what a serve's claim decided
    assert store.jobs.claim_next("serve-1", 3600, waits=lambda _conn, job: why) is None
    assert store.jobs.get(queued).message == f"waiting: {why}"
    store.close()


def test_experiments_list_filters_and_why_a_job_waits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/wall.db"
    wall_store(url)
    with serving(url) as base:
        listed, experiments = get(f"{base}/experiments")
        _, page = get(f"{base}/")
        bo = get_json(f"{base}/api/jobs?owner=bo")
        running = get_json(f"{base}/api/jobs?state=running")
        on_x86 = get_json(f"{base}/api/jobs?board=x86-1")
        bad = get_json(f"{base}/api/boards?state=bad")
        one = get_json(f"{base}/api/boards?board=x86-1")
        named = get_json(f"{base}/api/experiments?experiment=ALP")
        refused, why = get(f"{base}/api/jobs?state=sleeping")
        _, filtered_page = get(f"{base}/?owner=bo")
    assert listed == 200 and 'data-experiment="alpha"' in experiments  # was a 404
    queue = page[page.index('<table id="jobs">'):].split("</table>")[0]
    assert "waiting: arm-1 is reserved by bo until 18:00" in queue
    assert [(j["owner"], j["experiment"]) for j in bo] == [("bo", "beta")]
    assert [j["experiment"] for j in running] == ["alpha"]
    assert [j["experiment"] for j in on_x86] == ["alpha"]  # its matrix places runs there
    assert [b["name"] for b in bad] == ["arm-1"] and [b["name"] for b in one] == ["x86-1"]
    assert [e["name"] for e in named] == ["alpha"]
    assert refused == 400 and "a job's state" in why
    queue = filtered_page[filtered_page.index('<table id="jobs">'):].split("</table>")[0]
    assert "beta" in queue and "alpha" not in queue
    assert 'value="bo"' in filtered_page  # the form shows the filter in force


def test_the_live_page_keeps_its_filters(tmp_path: Path,
                                         browser: webdriver.Chrome) -> None:  # noqa: F811
    url = f"sqlite:///{tmp_path}/wall.db"
    wall_store(url)
    with serving(url) as base:
        browser.get(base + "/?owner=bo")
        WebDriverWait(browser, 60, poll_frequency=0.2).until(
            lambda d: (text_of(d, "#live") or "").startswith("updated"))  # one refresh done
        jobs = text_of(browser, "#jobs tbody")
        why = text_of(browser, "#jobs tr[data-job] .why")
        errors = console_errors(browser)
    assert "beta" in jobs and "alpha" not in jobs
    assert why == "waiting: arm-1 is reserved by bo until 18:00"
    assert errors == []


def test_latest_results_keep_revisions_apart_and_name_their_commits(
        tmp_path: Path, browser: webdriver.Chrome) -> None:  # noqa: F811
    """Two commits of this checkout measured on one cell: two rows of results, each named by
    its short sha and subject, on the page and after the live script's refresh."""
    url = f"sqlite:///{tmp_path}/revisions.db"
    store = Store.open(url)
    exp = SyntheticExperiment(store)
    commits = git_output("rev-list", "--max-count=2", "HEAD").split()
    for i, commit in enumerate(commits):
        exp.add_build(commit, build_record(source_hash=f"{i:064x}", revision=commit,
                                           binary_sha256=f"{i + 10:064x}"))
        exp.run(build=commit, decode_ms=10.0 * (i + 1))
    store.close()
    labels = {f"{c[:7]} {git_output('log', '-1', '--format=%s', c)}" for c in commits}
    with serving(url) as base:
        experiment = get_json(f"{base}/api/experiments/synthetic")
        browser.get(base + "/experiments/synthetic")
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#results .revision')].map(e => e.textContent)")
        WebDriverWait(browser, 60, poll_frequency=0.2).until(
            lambda d: (text_of(d, "#live") or "").startswith("updated"))
        refreshed = browser.execute_script(
            "return [...document.querySelectorAll('#results .revision')].map(e => e.textContent)")
    assert sorted(g["revision"] for g in experiment["groups"]) == sorted(commits)
    assert [g["runs"] for g in experiment["groups"]] == [1, 1]  # not pooled into one row of 2
    assert set(shown) == labels and set(refreshed) == labels


# Each text's box in SVG units, and the SVG's width: a legend cut off ends past the width,
# labels drawn over each other intersect.
TEXT_BOXES = """
return [...document.querySelectorAll("svg.plot")].map((svg) => ({
  width: svg.viewBox.baseVal.width,
  // (the rotated axis titles' boxes are in their own, rotated, coordinates: left out)
  texts: [...svg.querySelectorAll("text:not([transform])")].map((t) => {
    const b = t.getBBox();
    return {x: b.x, y: b.y, w: b.width, h: b.height, text: t.textContent,
            mark: t.classList.contains("mark-label")};
  })}));
"""


def overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def test_timeline_labels_and_legends_fit_their_charts(
        tmp_path: Path, browser: webdriver.Chrome) -> None:  # noqa: F811
    names = ["sparse k=32 block=64 probes=8 wq=q8_0 t=4", "exact wq=f32 t=4"]
    series = [Series(name, [(float(i), 10.0 + i + j) for i in range(30)])
              for j, name in enumerate(names)]
    revisions = [f"{i:07x}" for i in range(30)]
    marks = [Mark(3.0, "x2.1"), Mark(3.0, "x1.9"), Mark(4.0, "x0.52"), Mark(5.0, "x1.7")]
    timeline = line_chart("decode_ms_per_token by revision: local", series,
                          Axes("revision (commit order)", "ms", x_ticks=[float(i) for i in
                                                                         range(30)],
                               x_tick_labels=revisions), marks)
    bars = stacked_bars("decode by context", ["256", "1024"], names, ["attention", "rest"],
                        {("256", names[0], "attention"): 1.0, ("1024", names[1], "rest"): 2.0},
                        "ms/token")
    page = tmp_path / "charts.html"
    page.write_text(f"<!DOCTYPE html><html><body>{timeline}{bars}</body></html>")
    browser.get(page.as_uri())
    charts = browser.execute_script(TEXT_BOXES)
    assert len(charts) == 2
    for chart in charts:
        for text in chart["texts"]:
            assert 0 <= text["x"] and text["x"] + text["w"] <= chart["width"] + 0.5, text
    texts = charts[0]["texts"]
    labels = [t for t in texts if t["mark"]]
    assert sorted(t["text"] for t in labels) == ["x0.52", "x1.7", "x2.1, x1.9"]
    ticks = [t for t in texts if t["text"] in revisions]
    for group in (labels, ticks):
        assert not any(overlap(a, b) for i, a in enumerate(group) for b in group[i + 1:])
