"""The experiment report: tables from known rows, flags, determinism, and a real browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from fixtures_reports import SyntheticExperiment, healthy_fingerprint

from db import Store
from reports.aggregate import (
    critical_k_table,
    devices_table,
    k_sweep_table,
    latency_table,
    needle_table,
    timing_table,
    ttft_table,
)
from reports.render import render_report
from reports.runs import load_experiment

CHROMIUM = "/usr/bin/chromium"
# Recall by (k, ctx): k = 1 fails everywhere, k = 4 only at 512, k >= 8 matches exact.
RECALL = {None: 1.0, 1: 0.0, 4: None, 8: 1.0, 32: 1.0}


def _recall(k: int | None, ctx: int) -> float:
    value = RECALL[k]
    return (1.0 if ctx == 256 else 0.0) if value is None else value


@pytest.fixture
def known(tmp_path: Path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path}/report.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm", arch="aarch64", cls="rk3588", emulated=True)
    for ctx in (256, 512):
        for depth in (0.0, 0.5, 1.0):
            for k in RECALL:
                policy = "exact" if k is None else "sparse"
                for repeat in range(2):
                    exp.run(policy=policy, k=k, ctx=ctx, depth=depth, repeat=repeat,
                            recall=_recall(k, ctx), tokens=[9, 9] if k == 1 else [5, 6],
                            decode_ms=10.0 + ctx / 256,
                            attn_ms=(ctx / 256 if k is None else k / 32),
                            selection_mass=None if k is None else min(1.0, k / 8),
                            oracle_recall=None if k is None else min(1.0, k / 16))
    # Noisy timings (CV > 5 %), a powersave governor, an emulated board, a failed run.
    exp.run(policy="exact", ctx=1024, repeat=0, decode_ms=10.0)
    exp.run(policy="exact", ctx=1024, repeat=1, decode_ms=14.0,
            fingerprint=healthy_fingerprint(governor="powersave"))
    exp.run(device="arm", policy="exact", ctx=256, decode_ms=80.0)
    exp.run(policy="sparse", k=2, ctx=256, status="failed")
    yield store
    store.close()


def test_needle_and_k_sweep_tables_from_known_rows(known: Store) -> None:
    runs = load_experiment(known, "synthetic").runs
    needle = needle_table(runs)
    local = needle[needle["device"] == "local"]
    assert len(local) == 5 * 2 * 3 + 1  # configs x contexts x depths, + the ctx 1024 exact cell
    cell = local[(local["config"] == "sparse k=4 t=2") & (local["ctx"] == 512)]
    assert cell["recall"].tolist() == [0.0, 0.0, 0.0] and cell["n"].tolist() == [2, 2, 2]
    assert local["config"].drop_duplicates().tolist()[:5] == [
        "exact t=2", "sparse k=1 t=2", "sparse k=4 t=2", "sparse k=8 t=2", "sparse k=32 t=2"]

    sweep = k_sweep_table(runs)
    local_sweep = sweep[(sweep["device"] == "local") & (sweep["size"] == 256)]
    assert local_sweep["k"].tolist()[1:] == [1, 4, 8, 32]
    assert local_sweep["recall"].tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert local_sweep["same_as_exact"].tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert local_sweep["attn_ms"].tolist() == [1.0, 1 / 32, 4 / 32, 8 / 32, 1.0]

    critical = critical_k_table(sweep).set_index(["device", "ctx"])["critical_k"]
    assert critical[("local", 256)] == 4
    assert critical[("local", 512)] == 8

    latency = latency_table(runs)
    exact = latency[(latency["device"] == "local") & (latency["config"] == "exact t=2")
                    & (latency["ctx"] == 512)]
    assert exact["decode_ms"].item() == 12.0 and exact["attn_ms"].item() == 2.0
    assert exact["rest_ms"].item() == 10.0


def test_flags_in_the_timing_table(known: Store) -> None:
    timings = timing_table(load_experiment(known, "synthetic").runs).set_index(["device", "ctx",
                                                                               "config"])
    noisy = timings.loc[("local", 1024, "exact t=2")]
    assert noisy["decode_ms_median"] == 12.0 and noisy["decode_ms_min"] == 10.0
    assert noisy["decode_ms_cv"] == pytest.approx(0.2357, rel=1e-3)
    assert "CV > 5 %: decode_ms" in noisy["flags"]
    assert "non-performance-governor" in noisy["flags"]
    assert "emulated" in timings.loc[("arm", 256, "exact t=2")]["flags"]
    assert "failed" in timings.loc[("local", 256, "sparse k=2 t=2")]["flags"]
    clean = timings.loc[("local", 256, "exact t=2")]
    assert clean["flags"].tolist() == ["", "", ""]  # three depths, all clean


def test_every_documented_flag_reaches_the_report(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/flags.db")
    exp = SyntheticExperiment(store)
    # a snapshot taken before snapshots carried their flags: judged when it is stored
    busy = {**healthy_fingerprint(), "loadavg": [3.5, 2.0, 1.0], "mem_total_kb": 4000000,
            "mem_available_kb": 100000}
    exp.run(ctx=256, fingerprint=busy)
    # a snapshot that carries the judgement made when it was taken: shown as stored
    dmc = {"device": "dmc", "governor": "dmc_ondemand", "cur_hz": 528000000,
           "min_hz": 528000000, "max_hz": 2112000000,
           "available_hz": [528000000, 1068000000, 1560000000, 2112000000]}
    exp.run(ctx=512, device="board", fingerprint={**healthy_fingerprint(), "devfreq": [dmc],
                                                  "flags": ["memory-clock-low"]})
    data = load_experiment(store, "synthetic")
    timings = timing_table(data.runs).set_index("ctx")
    assert timings.loc[256, "flags"] == "loaded; low-memory"
    assert timings.loc[512, "flags"] == "memory-clock-low"
    devices = devices_table(data.runs, data.device_fingerprints).set_index("device")
    assert devices.loc["board", "memory_clock"] == "dmc 528/2112 MHz (dmc_ondemand)"
    assert devices.loc["local", "memory_clock"] == ""
    report = (render_report(store, "synthetic", tmp_path / "out").parent / "report.md").read_text()
    assert "loaded; low-memory" in report and "memory-clock-low" in report
    store.close()


def test_report_opens_with_what_sparse_attention_buys(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/headline.db")
    exp = SyntheticExperiment(store)
    # 256 tokens = 8 blocks of 32: k = 32 covers them all. 2048 = 64 blocks: k = 32 is half.
    for depth in (0.25, 0.75):
        exp.run(ctx=256, depth=depth, attn_ms=1.0, bytes_read=1000)
        exp.run(ctx=2048, depth=depth, attn_ms=4.0, decode_ms=10.0, bytes_read=8000)
        for k, recall in ((8, 0.0), (32, 1.0)):
            exp.run(ctx=256, depth=depth, policy="sparse", k=k, attn_ms=1.5, bytes_read=1100)
            exp.run(ctx=2048, depth=depth, policy="sparse", k=k, recall=recall,
                    attn_ms=k / 16, decode_ms=8.0, bytes_read=k * 140)
    text = (render_report(store, "synthetic", tmp_path / "out").parent / "report.md").read_text()
    first = text.split("## ")[1]
    assert first.startswith("What this shows\n")
    assert "At 256 tokens k = 32 already covers every block" in first
    assert "(attention 1.5 against 1 ms/token at 256)" in first
    assert ("At 2048 tokens (64 blocks) k = 32 is the smallest k measured that finds the needle "
            "as often as exact attention (2/2 runs against 2/2)") in first
    assert "50 % of the blocks, reads 56 % of exact's bytes" in first
    assert "attention takes 2 against 4 ms/token (0.50x)" in first
    assert "decode step 8 against 10 ms (0.80x)" in first
    assert "lose the needle (k = 8: 0/2 runs)" in first
    # no exact/sparse pair, no paragraph
    SyntheticExperiment(store, name="only-exact").run(ctx=256)
    only = (render_report(store, "only-exact", tmp_path / "plain").parent / "report.md").read_text()
    assert "What this shows" not in only
    store.close()


def test_the_headline_takes_the_complete_real_board_and_names_it(tmp_path: Path) -> None:
    """An emulated board with a failed run sorts first by name; the figures are still the real,
    complete board's, and the paragraph says which board they are from."""
    store = Store.open(f"sqlite:///{tmp_path}/boards.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm-emu", arch="aarch64", cls="rk3588", emulated=True)
    for device, slow in (("arm-emu", 10.0), ("x86", 1.0)):
        for depth in (0.25, 0.75):
            exp.run(device=device, ctx=2048, depth=depth, attn_ms=4.0 * slow, decode_ms=10.0)
            exp.run(device=device, ctx=2048, depth=depth, policy="sparse", k=32, recall=1.0,
                    attn_ms=2.0 * slow, decode_ms=8.0)
    exp.run(device="arm-emu", ctx=2048, depth=0.5, status="failed")
    text = (render_report(store, "synthetic", tmp_path / "out").parent / "report.md").read_text()
    store.close()
    # two boards: their comparison leads, then what the runs show
    assert text.split("## ")[1].startswith("Devices compared")
    first = text.split("## What this shows")[1].split("## ")[0]
    assert "attention takes 2 against 4 ms/token" in first  # x86's, not arm-emu's 20 and 40
    assert "Medians over the ok runs on x86 (a real board)" in first and "arm-emu" not in first


def test_time_to_first_token_per_prefill_attention_and_length(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/ttft.db")
    exp = SyntheticExperiment(store)
    for ctx in (1024, 4096):
        for repeat, noise in enumerate((0.0, 10.0, -4.0)):  # medians: the middle value
            exp.run(kind="decode", ctx=ctx, repeat=repeat, prefill_ms=ctx / 8 + noise,
                    peak_rss_kb=9000, kv_resident_bytes=ctx * 1000)
            exp.run(kind="decode", ctx=ctx, repeat=repeat, policy="sparse", k=8,
                    prefill_attn="sparse", prefill_ms=ctx / 16 + noise)
    exp.run(kind="decode", ctx=4096, policy="sparse", k=8, prefill_attn="sparse",
            status="failed")  # not timed
    table = ttft_table(load_experiment(store, "synthetic").runs)
    rows = {(r.ctx, r.prefill_attn): r for r in table.itertuples()}
    assert sorted(rows) == [(1024, "exact"), (1024, "sparse"), (4096, "exact"), (4096, "sparse")]
    exact, sparse = rows[(4096, "exact")], rows[(4096, "sparse")]
    assert (exact.ttft_ms, exact.ttft_min_ms, exact.ttft_max_ms, exact.n) == (512, 508, 522, 3)
    assert (sparse.ttft_ms, sparse.vs_exact, exact.vs_exact) == (256, 2.0, 1.0)
    assert rows[(1024, "sparse")].vs_exact == pytest.approx(128 / 64)
    assert sparse.config == "sparse k=8 prefill_attn=sparse t=2"
    # memory where the engine printed it (MB), nothing where it did not
    assert (exact.peak_rss_mb, exact.kv_resident_mb) == (9.0, 4.096)
    assert pd.isna(sparse.peak_rss_mb) and pd.isna(sparse.kv_resident_mb)
    out = render_report(store, "synthetic", tmp_path / "out").parent
    report = (out / "report.md").read_text()
    section = report.split("## Time to first token\n")[1].split("\n## ")[0]
    assert "vs_exact" in section and "peak_rss_mb" in section
    assert "kv_allocated_mb" not in section  # empty everywhere: left out of the view
    assert "time to first token vs prompt length: local" in section  # the figure
    assert (out / "ttft.csv").read_text().count("\n") == 5
    assert "peak_rss_kb" in (out / "runs.csv").read_text().splitlines()[0]
    store.close()


def test_rendering_is_byte_identical(known: Store, tmp_path: Path) -> None:
    first = render_report(known, "synthetic", tmp_path / "one").parent
    second = render_report(known, "synthetic", tmp_path / "two").parent
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"index.html", "report.md", "manifest.json", "needle.csv", "k_sweep.csv",
            "critical_k.csv", "latency.csv", "selection.csv", "timings.csv",
            "runs.csv"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # Two devices: the other one against the real reference device, flagged as emulated.
    # The flag every row carries is said once, in the summary that leads the comparison.
    devices = (first / "compare_decode_ms_per_token_arm.csv").read_text().splitlines()
    assert len(devices) == 2 and ",exact," in devices[1] and "emulated" not in devices[1]
    summary = (first / "compare_decode_ms_per_token_arm_summary.csv").read_text()
    assert "policy,exact,1," in summary
    assert "every row: B: emulated" in (first / "report.md").read_text()
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["run_counts"] == {"failed": 1, "ok": 63}
    assert manifest["reproduce"]["runs"][0].startswith("benchfarm reproduce ")
    assert manifest["builds"][0]["binary_sha256"] == "c" * 64
    html = (first / "index.html").read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html and "<script" not in html


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
def test_report_renders_in_headless_chromium(known: Store, tmp_path: Path) -> None:
    index = render_report(known, "synthetic", tmp_path / "out")
    profile = tmp_path / "profile"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
              "--no-first-run", "--disable-background-networking", "--disable-component-update",
              "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    shot = tmp_path / "report.png"
    scratch = {**os.environ, "TMPDIR": str(tmp_path)}  # its org.chromium.Chromium.* folders
    done = subprocess.run([*common, "--window-size=1400,2000", f"--screenshot={shot}",
                           index.as_uri()], capture_output=True, text=True, timeout=120,
                          env=scratch)
    assert shot.is_file() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = subprocess.run([*common, "--dump-dom", index.as_uri()], capture_output=True, text=True,
                         timeout=120, env=scratch)
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or
               "Uncaught" in line or "net::ERR" in line]
    assert console == []
    # The browser parsed the inline SVG plots into the DOM: heatmaps, k-sweep and latency charts.
    assert dom.stdout.count("<svg") >= 10
    # Heatmap cells: local exact 3 depths x 3 contexts, 4 sparse configs x 6, arm exact 1.
    assert dom.stdout.count('class="cell"') == 9 + 4 * 6 + 1
    assert 'class="series"' in dom.stdout and 'class="bar"' in dom.stdout
    shutil.rmtree(profile, ignore_errors=True)


def test_line_chart_keeps_every_point_inside_the_plot() -> None:
    import re

    from reports.plots import Axes, Series, heat_colour, line_chart

    svg = line_chart("t", [Series("exact", [(8, 57.5), (32, 57.5)], dashed=True),
                           Series("sparse", [(8, 24.4), (32, 51.1)])],
                     Axes("k", "ms", log_x=True))
    frame = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)
    top, height = float(frame.group(2)), float(frame.group(4))
    ys = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert len(ys) == 4 and all(top <= y <= top + height for y in ys)
    assert 'stroke-dasharray="5,3"' in svg  # the exact reference line
    assert svg == line_chart("t", [Series("exact", [(8, 57.5), (32, 57.5)], dashed=True),
                                   Series("sparse", [(8, 24.4), (32, 51.1)])],
                             Axes("k", "ms", log_x=True))
    assert heat_colour(0.0) == "#d73027" and heat_colour(1.0) == "#1a9850"
    assert heat_colour(None) == "#dddddd"


def test_report_goes_under_out_reports_unless_out_says(known: Store, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated reports sit outside the packages: out/reports/<experiment>/ where the command
    runs, or the folder --out names."""
    from harness.cli import main

    url = str(known.database.url)
    monkeypatch.chdir(tmp_path)
    assert main(["--db", url, "report", "synthetic"]) == 0
    assert (tmp_path / "out" / "reports" / "synthetic" / "index.html").is_file()
    assert main(["--db", url, "report", "synthetic", "--out", "elsewhere"]) == 0
    assert (tmp_path / "elsewhere" / "index.html").is_file()
    assert not (tmp_path / "reports").exists()


def test_markdown_text_leaves_alone_only_what_it_would_not_change() -> None:
    """markdown_text returns text without line breaks, HTML or markdown syntax as it is (most
    cells): the shortcut must agree with the full treatment for every character."""
    from html import escape

    from reports.tables import MARKDOWN_CHANGED, MARKDOWN_SPECIAL, markdown_text

    def full(text: str) -> str:
        return MARKDOWN_SPECIAL.sub(r"\\\1", escape(" ".join(text.splitlines()), quote=False))

    for code in range(0x3000):
        char = chr(code)
        assert (full(char) != char) == bool(MARKDOWN_CHANGED.search(char)), hex(code)
    for text in ("a|b", "x\u2028y", "sparse k=32 t=1", "a & <b>", "[3]", "\\", "x\ny\r\n", ""):
        assert markdown_text(text) == full(text)
