"""Physical sanity: a board's health check measures its memory read bandwidth (by buffer size)
and its FMA peak with bench/c's programs, built and run on the board; every decode and prefill
figure gets its share of that roofline, and a figure beyond 110 % of it is flagged impossible
and left out of the history. A real run of the tiny model on the local board, a real store."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_history_git import SPEC

from db import Store
from harness import REPO_ROOT


def cli(db: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BENCHFARM_INVENTORY"}
    env["PYTHONPATH"] = str(REPO_ROOT)  # this checkout's harness, from any folder
    return subprocess.run([sys.executable, "-m", "harness.cli", "--db", f"sqlite:///{db}",
                           *args], cwd=db.parent, env=env, capture_output=True, text=True,
                          timeout=900)


def test_limits_are_measured_on_the_board_and_a_figure_beyond_them_is_impossible(
        tmp_path: Path) -> None:
    db = tmp_path / "roof.db"
    spec = tmp_path / "roof.toml"
    spec.write_text(SPEC.format(model=REPO_ROOT / "models" / "needle-tiny")
                    .replace('name = "hist"', 'name = "roof"'))  # 3 runs of a decode
    ran = cli(db, "run", str(spec))
    assert ran.returncode == 0, ran.stderr[-3000:]
    checked = cli(db, "devices", "check", "local", "--json")
    assert checked.returncode == 0, checked.stderr[-3000:]
    (report,) = json.loads(checked.stdout)
    items = {i["name"]: i for i in report["checks"]}
    read, fma = items["memory read"], items["fma peak"]
    assert read["key"] == "read_gbps" and read["value"] > 0 and "GB/s" in read["detail"]
    assert fma["key"] == "fma_gflops" and fma["value"] > 0
    with Store.open(f"sqlite:///{db}") as store:
        (stored,) = store.boards.health("local", limit=1)
        limits = store.board_limits(["local"])["local"]
    assert limits["read_gbps"] == read["value"] and limits["fma_gflops"] == fma["value"]
    assert set(limits["read_gbps_by_mib"]) == {"1", "4", "16", "128"}
    assert stored.ok

    shown = json.loads(cli(db, "runs", "show", "1", "--json").stdout)
    # a real prefill of the tiny model is far below the board's FMA peak; its decode's working
    # set (a few MB) may sit in a cache and is not judged against the read bandwidth
    assert 0 < shown["roofline_share"]["prefill_ms"] < 1.1
    assert shown["roofline_share"]["decode_ms_per_token"] is None
    history = json.loads(cli(db, "history", "roof", "--json").stdout)
    assert history["impossible"] == [] and len(history["series"][0]["points"][0]["values"]) == 3
    assert_frame_shares_are_per_run_shares(db)

    # a board whose stored limits are far below what its runs did: every figure is impossible
    slow = {"1": 0.001, "128": 0.001}
    with Store.open(f"sqlite:///{db}") as store:
        store.boards.record_health("local", True, [
            {"name": "memory read", "ok": True, "detail": "a broken check", "key": "read_gbps",
             "value": 0.001, "read_gbps_by_mib": slow},
            {"name": "fma peak", "ok": True, "detail": "", "key": "fma_gflops", "value": 1e-6}],
            "test")
    shown = cli(db, "runs", "show", "1")
    assert "prefill " in shown.stdout and "IMPOSSIBLE" in shown.stdout
    assert_frame_shares_are_per_run_shares(db)
    history = json.loads(cli(db, "history", "roof", "--metric", "prefill_ms", "--json").stdout)
    assert history["series"] == [] and sorted(r["run_id"] for r in history["impossible"]) == \
        [1, 2, 3]
    text = cli(db, "history", "roof", "--metric", "prefill_ms").stdout
    assert "3 run(s) left out: prefill_ms beyond the board's roofline" in text
    # and the report's roofline table counts them
    reported = cli(db, "report", "roof", "--out", str(tmp_path / "report"))
    assert reported.returncode == 0, reported.stderr[-3000:]
    (row,) = csv.DictReader((tmp_path / "report" / "roofline.csv").open())
    assert (row["device"], row["runs"], row["impossible"]) == ("local", "3", "3")
    assert float(row["prefill_share"]) > 1.1


def assert_frame_shares_are_per_run_shares(db: Path) -> None:
    """The shares history computes for all runs at once (``shares_frame``) are those of each
    run alone (``shares_of``, what `runs show` prints): on the stored runs, and on copies of
    them varied where the computation branches (weights and KV types, a model large enough
    for its decode to be judged, no prompt, no threads, no figure, a board without limits,
    a model without a config)."""
    from reports.roofline import SHARED, limits_of, shares_frame, shares_of

    with Store.open(f"sqlite:///{db}") as store:
        real = store.history_frame("roof")
        limits = store.board_limits(["local"])
    assert len(real) == 3 and real["model_config"].map(bool).all()
    varied = [real]
    for change in ({"wq": "q8"}, {"wq": "bf16", "kv": "q8"}, {"wq": "int3"},
                   {"model_config": QWEN3_06B}, {"model_config": QWEN3_06B, "kv": "q8"},
                   {"prompt_tokens": 0}, {"prompt_tokens": None}, {"threads": 0},
                   {"threads": 4}, {"decode_ms_per_token": None}, {"prefill_ms": 0.0},
                   {"device": "elsewhere"}, {"model_config": None},
                   {"model_config": {"hidden_size": 8}}):
        copy = real.copy()
        for column, value in change.items():
            copy[column] = [value] * len(copy)
        varied.append(copy)
    runs = pd.concat(varied, ignore_index=True)
    frame = shares_frame(runs, limits)
    judged = dict.fromkeys(SHARED, 0)
    for i, row in enumerate(runs.to_dict("records")):
        alone = shares_of(row["model_config"], row, limits_of(limits.get(row["device"])))
        for metric in SHARED:
            got = frame[metric].iloc[i]
            if alone[metric] is None:
                assert math.isnan(got), (metric, i, got)
            else:
                judged[metric] += 1
                assert got == pytest.approx(alone[metric], rel=1e-12), (metric, i)
    # prefill judged for most rows; decode for the large model's (the tiny one's fits a cache)
    assert judged["prefill_ms"] >= len(real) * 8 and judged["decode_ms_per_token"] >= len(real)


QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 151936}  # the 0.6B checkpoint's config.json


def test_a_decode_beyond_the_read_bandwidth_is_impossible_and_a_cached_one_unjudged() -> None:
    from reports.roofline import IMPOSSIBLE, Limits, Shape, decode_share, weight_bytes_per_token

    limits = Limits(read_gbps=10.0, read_gbps_by_mib={"1": 60.0, "4": 40.0, "16": 11.0,
                                                      "128": 10.0})
    read = weight_bytes_per_token(Shape.from_config(QWEN3_06B), "bf16")  # ~1.2 GB a token
    at_the_bound_ms = read / 11e9 * 1000  # the fastest buffer no larger than it: 16 MiB's
    assert decode_share(QWEN3_06B, "bf16", "f32", 0, at_the_bound_ms, limits) == \
        pytest.approx(1.0)
    assert decode_share(QWEN3_06B, "bf16", "f32", 0, at_the_bound_ms / 2, limits) > IMPOSSIBLE
    tiny = {**QWEN3_06B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "vocab_size": 512}
    assert decode_share(tiny, "f32", "f32", 0, 1e-6, limits) is None  # fits a cache
