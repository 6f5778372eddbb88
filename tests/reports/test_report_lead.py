"""What a report and `status` open with: a warning when exact attention fails its own workload,
the comparison an experiment was run for, the unit of replication; no CV for one run."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from fixtures_reports import SyntheticExperiment, build_record

from db import Store
from harness.commands.demo import SUMMARY_TITLE, summary_table
from harness.commands.status import render_summary
from reports.aggregate import critical_k_table, k_sweep_table, latency_table, timing_table
from reports.compare import compare, terminal_table
from reports.figures import latency_charts
from reports.headline import what_this_shows
from reports.render import render_report, timing_display
from reports.runs import load_experiment


def _headings(markdown: str) -> list[str]:
    return re.findall(r"^## (.+)$", markdown, flags=re.MULTILINE)


def test_a_failed_baseline_opens_the_report_and_status(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/broken.db")
    exp = SyntheticExperiment(store)
    for repeat in range(2):  # the answer cut off: no config recalls, exact included
        exp.run(ctx=256, repeat=repeat, recall=0.0)
        exp.run(ctx=256, repeat=repeat, policy="sparse", k=8, recall=0.0)
        exp.run(ctx=512, repeat=repeat, recall=1.0)  # a context where exact still works
        exp.run(kind="ppl", ctx=64, repeat=repeat, ppl=5.0e4, recall=None)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    first = _headings(markdown)[0]
    assert first == "Warning: the baseline failed"
    warning = markdown.split("## Warning: the baseline failed\n", 1)[1].split("\n## ")[0]
    assert "local needle ctx=256: recall 0.00" in warning
    assert "local ppl length=64: perplexity 5e+04" in warning
    assert "ctx=512" not in warning  # exact recalled there
    status = render_summary(store.experiment_summary("synthetic"))
    assert status.startswith("WARNING: exact attention, the baseline, fails its own workload")
    assert "perplexity 5e+04" in status.splitlines()[0]
    store.close()


def test_a_sound_baseline_gives_no_warning(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/sound.db")
    exp = SyntheticExperiment(store)
    exp.run(ctx=256, recall=1.0)
    exp.run(ctx=256, policy="sparse", k=1, recall=0.0)  # a sparse config may fail: that is news
    exp.run(kind="ppl", ctx=64, ppl=12.0, recall=None)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    assert "Warning" not in _headings(markdown) and "WARNING" not in markdown
    assert "WARNING" not in render_summary(store.experiment_summary("synthetic"))
    store.close()


def test_a_device_comparison_leads_and_the_unit_of_replication_is_named(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/devices.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm", arch="aarch64", cls="rk3588")
    for repeat in range(5):
        exp.run(ctx=256, repeat=repeat, decode_ms=10.0 + repeat / 100)
        exp.run(device="arm", ctx=256, repeat=repeat, decode_ms=15.0 + repeat / 100)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    headings = _headings(markdown)
    assert headings[0] == "Devices compared"
    assert headings.index("Devices compared") < headings.index("Manifest")
    assert "1 faster" in markdown.split("## Manifest")[0]  # local against arm, 5 a side: decided
    assert "Unit of replication: the run" in markdown
    store.close()


def test_one_run_shows_no_cv_and_more_runs_do(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/cv.db")
    exp = SyntheticExperiment(store)
    exp.run(ctx=256, decode_ms=10.0)
    exp.run(ctx=512, repeat=0, decode_ms=10.0)
    exp.run(ctx=512, repeat=1, decode_ms=12.0)
    shown = timing_display(timing_table(load_experiment(store, "synthetic").runs))
    by_ctx = shown.set_index("ctx")["decode ms/token CV"]
    assert by_ctx[256] == ""
    assert by_ctx[512] == "12.9 %"
    store.close()


def test_the_headline_says_where_sparse_prefill_is_slower(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/ttft.db")
    exp = SyntheticExperiment(store)
    for repeat in range(2):
        for ctx, sparse_ms in ((512, 40.0), (2048, 300.0)):  # exact prefill: ctx / 8 ms
            exp.run(kind="decode", ctx=ctx, repeat=repeat, prefill_ms=ctx / 8)
            exp.run(kind="decode", ctx=ctx, repeat=repeat, policy="sparse", k=8,
                    prefill_attn="sparse", prefill_ms=sparse_ms)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    headline = markdown.split("## What this shows\n")[1].split("\n## ")[0]
    assert ("Time to first token on local: Sparse prefill is SLOWER than exact at 2048 tokens "
            "(0.85x); faster at 512 tokens (1.60x)") in headline
    store.close()


def _two_revisions(path: Path) -> tuple[Store, SyntheticExperiment]:
    """A store whose experiment has builds of two engine revisions: rev-a ("default") and
    rev-b ("new")."""
    store = Store.open(f"sqlite:///{path}")
    exp = SyntheticExperiment(store)
    exp.add_build("new", build_record(source_hash="b" * 64, revision="rev-b",
                                      binary_sha256="b" * 64))
    return store, exp


def test_k_sweep_keeps_revisions_apart(tmp_path: Path) -> None:
    store, exp = _two_revisions(tmp_path / "revs.db")
    for build, slow in (("default", 1.0), ("new", 5.0)):
        for k in (8, 32):
            exp.run(policy="sparse", k=k, build=build, decode_ms=10.0 * slow)
        exp.run(build=build, decode_ms=12.0 * slow)
    sweep = k_sweep_table(load_experiment(store, "synthetic").runs)
    assert sorted(set(sweep["revision"])) == ["rev-a", "rev-b"]
    assert sweep["n"].tolist() == [1] * 6  # one run a cell: nothing pooled
    by_rev = sweep[sweep["policy"] == "exact"].set_index("revision")["decode_ms"]
    assert (by_rev["rev-a"], by_rev["rev-b"]) == (12.0, 60.0)
    critical = critical_k_table(sweep)
    assert sorted(critical["revision"]) == ["rev-a", "rev-b"]
    store.close()


def test_charts_draw_the_spread_of_cells_with_more_than_one_run(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/spread.db")
    exp = SyntheticExperiment(store)
    exp.run(ctx=256, decode_ms=10.0, attn_ms=4.0)  # one run: no whisker
    for repeat, decode_ms in enumerate((20.0, 24.0, 30.0)):
        exp.run(ctx=512, repeat=repeat, decode_ms=decode_ms, attn_ms=4.0)
    latency = latency_table(load_experiment(store, "synthetic").runs)
    ((title, svg),) = latency_charts(latency)
    assert "whiskers: min-max over runs" in title
    whiskers = re.findall(r'<path class="spread" d="([^"]+)"', svg)
    assert len(whiskers) == 1  # the 512-token bar only
    ys = [float(y) for y in re.findall(r"[MHV]-?[\d.]+,?(-?[\d.]+)?", whiskers[0]) if y]
    bar_tops = [float(y) for y in re.findall(r'<rect class="bar" x="[\d.]+" y="([\d.]+)"', svg)]
    # the whisker spans 20..30 ms around the bar's median (24 ms): its top is above the bar's
    assert min(ys) < min(bar_tops) < max(ys)
    store.close()


def test_compare_says_first_when_it_mixes_experiments(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/mixed.db")
    for name in ("first", "second"):
        exp = SyntheticExperiment(store, name=name, spec_text=f'name = "{name}"\n')
        exp.add_device("arm", arch="aarch64", cls="rk3588")
        for repeat in range(4):
            exp.run(ctx=256 if name == "first" else 512, repeat=repeat, decode_ms=10.0)
            exp.run(device="arm", ctx=256 if name == "first" else 512, repeat=repeat,
                    decode_ms=20.0)
    mixed = terminal_table(compare(store, "local", "arm"))
    assert mixed.startswith("MIXES 2 EXPERIMENTS (first, second; --experiment NAME compares "
                            "within one): B = arm vs A = local")
    one = terminal_table(compare(store, "local", "arm", ["first"]))
    assert one.startswith("B = arm vs A = local") and "MIXES" not in one
    store.close()


def test_the_demo_table_keeps_context_lengths_apart(tmp_path: Path) -> None:
    """At 512 tokens k = 32 covers every block (slower than exact); at 2048 it is faster:
    pooled, the two would cancel out."""
    store = Store.open(f"sqlite:///{tmp_path}/demo.db")
    exp = SyntheticExperiment(store)
    for repeat in range(2):
        for ctx, exact_ms, sparse_ms in ((512, 4.0, 5.0), (2048, 10.0, 6.0)):
            exp.run(ctx=ctx, repeat=repeat, decode_ms=exact_ms + repeat)
            exp.run(ctx=ctx, repeat=repeat, policy="sparse", k=32, decode_ms=sparse_ms + repeat)
    # a ppl run: its workload (a length) and its engine document name no context length
    exp.run(kind="ppl", ctx=512, recall=None, ppl=20.0, raw={"command": "ppl", "ppl": 20.0})
    table = summary_table(store, "synthetic")
    assert table[table["ctx"].isna()]["runs"].tolist() == [1]  # kept, not an error
    table = table.dropna(subset=["ctx"]).astype({"ctx": int}).set_index(["ctx", "policy"])
    assert "context length" in SUMMARY_TITLE
    assert table.loc[(512, "sparse"), "x exact"] == "1.22"  # 5.5 / 4.5
    assert table.loc[(2048, "sparse"), "x exact"] == "0.62"  # 6.5 / 10.5
    assert table.loc[(2048, "exact"), "decode_ms/token"] == "10.500 [10.000, 11.000]"
    store.close()


def test_the_headline_says_whether_its_decode_ratio_is_decided(tmp_path: Path) -> None:
    def headline(repeats: int) -> str:
        store = Store.open(f"sqlite:///{tmp_path}/decided-{repeats}.db")
        exp = SyntheticExperiment(store)
        for repeat in range(repeats):  # 2048 tokens: 64 blocks, k = 32 is half of them
            exp.run(ctx=2048, repeat=repeat, decode_ms=10.0 + repeat / 100)
            exp.run(ctx=2048, repeat=repeat, policy="sparse", k=32,
                    decode_ms=6.0 + repeat / 100)
        text = what_this_shows(load_experiment(store, "synthetic").runs)
        store.close()
        return text

    assert "(0.60x), faster (Mann-Whitney U over 5 and 5 runs, p = 0.0079)" in headline(5)
    assert ("(0.60x), not decided (2 runs a side; the Mann-Whitney U test needs 4: raise "
            "repeats)") in headline(2)


def test_an_engine_comparison_leads(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/engines.db")
    exp = SyntheticExperiment(store)
    exp.add_build("llama", build_record(source_hash="c" * 64, binary_sha256="c" * 64))
    # lmc (exact attention) 10 ms/token, llama-bench 15: five runs each
    engines = (("lmc", "exact", "default", 10.0), ("llama-bench", None, "llama", 15.0))
    for (engine, policy, build, ms), repeat in itertools.product(engines, range(5)):
        exp.run(kind="decode", repeat=repeat, policy=policy, engine=engine, build=build,
                decode_ms=ms + repeat / 100)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    assert _headings(markdown)[0] == "Engines compared"
    section = markdown.split("## Engines compared\n")[1].split("\n## ")[0]
    assert "B = llama-bench vs A = lmc" in section and "1 slower" in section
    store.close()


def test_the_history_timeline_draws_the_spread_of_each_revision(tmp_path: Path) -> None:
    store, exp = _two_revisions(tmp_path / "timeline.db")
    for (build, ms), repeat in itertools.product((("default", 10.0), ("new", 8.0)), range(3)):
        exp.run(build=build, repeat=repeat, decode_ms=ms + repeat)
    page = (render_report(store, "synthetic", tmp_path / "out", revision_order=sorted)
            .read_text())
    history = page.split('<section id="history">')[1].split("</section>")[0]
    assert "by revision: local (whiskers: min-max over runs)" in history
    assert history.count('class="spread"') >= 2  # a whisker per revision of the series
    store.close()
