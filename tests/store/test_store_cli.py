"""`benchfarm status`, `runs list|show` and `export` over a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from fixtures_db import add_refs, sample_result

from db import Store
from harness.cli import main


@pytest.fixture
def filled(sqlite_url: str) -> str:
    """A store with one experiment: two ok runs (sparse k=4, exact) and one failed run."""
    with Store.open(sqlite_url) as store:
        refs = add_refs(store, experiment="needle demo")
        store.save_run(sample_result(refs, "a" * 64, steps=3))
        store.save_run(sample_result(refs, "b" * 64, status="failed", outcome=None, steps=0,
                                     error="Traceback ...\nlmc: error: --k must be >= 1\n"))
        store.save_run(sample_result(refs, "c" * 64, policy="exact", k=None, steps=5,
                                     decode_ms_per_token=20.0))
    return sqlite_url


def cli(capsys: pytest.CaptureFixture, url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--db", url, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_status_lists_experiments_and_summarises_one(filled: str, capsys) -> None:
    code, out, _ = cli(capsys, filled, "status")
    assert code == 0
    header, _, row = out.splitlines()
    assert header.split()[:6] == ["experiment", "runs", "ok", "failed", "interrupted", "pending"]
    assert row.split()[:7] == ["needle", "demo", "3", "2", "1", "0", "0"]

    code, out, _ = cli(capsys, filled, "status", "needle demo")
    assert code == 0
    assert "3 runs: 2 ok, 1 failed, 0 interrupted, 0 pending" in out
    exact = next(line for line in out.splitlines() if " exact " in line).split()
    # command policy k device revision (the fixture's build's) runs decode ms/tok
    assert exact[:6] == ["generate", "exact", "-", "local", "working-tree", "1"]
    assert exact[6] == "20.00"


def test_status_of_an_empty_store_and_of_unknown_names(sqlite_url: str, filled: str,
                                                       tmp_path: Path, capsys) -> None:
    empty = f"sqlite:///{tmp_path}/empty.db"
    Store.open(empty).close()
    assert cli(capsys, empty, "status")[1].startswith("no experiments stored yet")
    code, _, err = cli(capsys, filled, "status", "nope")
    assert code == 2 and "no experiment named 'nope'" in err and "needle demo" in err
    missing = tmp_path / "missing.db"
    code, _, err = cli(capsys, f"sqlite:///{missing}", "runs", "list")
    assert code == 2 and "no result store at" in err and not missing.exists()


def test_runs_list_filters_and_shows_the_error_line(filled: str, capsys) -> None:
    code, out, _ = cli(capsys, filled, "runs", "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 + 3
    code, out, _ = cli(capsys, filled, "runs", "list", "--status", "failed")
    (row,) = out.splitlines()[2:]
    assert row.split()[1] == "b" * 12 and row.endswith("lmc: error: --k must be >= 1")
    assert cli(capsys, filled, "runs", "list", "--status", "pending")[1] == "no runs match\n"


def test_runs_show_by_key_or_id(filled: str, capsys) -> None:
    code, out, _ = cli(capsys, filled, "runs", "show", "c" * 64, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["run"]["id"] == 3 and shown["run"]["policy"] == "exact"
    assert shown["token_timings"] == "5 decode steps" and shown["workload"]["ids"] == "4 token ids"
    assert shown["outcome"]["recall"] == 1.0 and shown["device"]["name"] == "local"
    # The 12-character key prefix that `runs list` prints is enough.
    assert json.loads(cli(capsys, filled, "runs", "show", "c" * 12, "--json")[1])["run"]["id"] == 3
    full = json.loads(cli(capsys, filled, "runs", "show", "3", "--full", "--json")[1])
    assert [t["token"] for t in full["token_timings"]] == [100, 101, 102, 103, 104]
    assert full["workload"]["ids"] == [1, 2, 3, 4]
    code, _, err = cli(capsys, filled, "runs", "show", "999")
    assert code == 2 and "no run with id or key '999'" in err


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_writes_every_table(filled: str, tmp_path: Path, capsys, fmt: str) -> None:
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, filled, "export", "needle demo", "--format", fmt,
                       "--out", str(out_dir))
    assert code == 0 and f"token_timings.{fmt}  (8 rows)" in out
    with Store.open(filled) as store:
        frames = store.frames("needle demo")
    for name, frame in frames.items():
        path = out_dir / f"{name}.{fmt}"
        back = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
        assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    timings = (pd.read_csv if fmt == "csv" else pd.read_parquet)(out_dir / f"token_timings.{fmt}")
    pd.testing.assert_frame_equal(timings, frames["token_timings"], check_dtype=False)


def test_export_default_folder_is_named_after_the_experiment(filled: str, tmp_path: Path,
                                                             monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, filled, "export", "needle demo")[0] == 0
    assert (tmp_path / "export" / "needle_demo" / "runs.csv").is_file()


def test_runs_show_lists_every_measurement_and_export_can_take_all(
        filled: str, tmp_path: Path, capsys) -> None:
    with Store.open(filled) as store:  # the failed run retried: ok now, the failure kept
        refs = add_refs(store, experiment="needle demo")
        store.save_run(sample_result(refs, "b" * 64, steps=2, decode_ms_per_token=30.0))
    code, out, _ = cli(capsys, filled, "runs", "show", "b" * 12)
    assert code == 0 and "status ok (measurement 4" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] != []
            and line.split()[0].isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [("2", "1", "failed"), ("4", "2", "ok")]
    shown = json.loads(cli(capsys, filled, "runs", "show", "b" * 12, "--json")[1])
    assert [m["status"] for m in shown["measurements"]] == ["failed", "ok"]
    assert all(m["started_at"] and m["finished_at"] and "wall_ms" in m
               for m in shown["measurements"])
    assert [m["token_timings"] for m in shown["measurements"]] == ["0 decode steps",
                                                                   "2 decode steps"]
    assert shown["measurements"][1]["snapshots"][0]["phase"] == "before"
    listing = cli(capsys, filled, "runs", "list")[1].splitlines()
    assert listing[0].split()[:5] == ["id", "key", "experiment", "device", "revision"]
    assert "working-tree" in listing[3] and listing[3].split()[-5:-3] == ["ok", "2"]
    out_dir = tmp_path / "all"
    code, out, _ = cli(capsys, filled, "export", "needle demo", "--all-measurements",
                       "--out", str(out_dir))
    assert code == 0 and "runs.csv  (4 rows)" in out
    assert "runs.csv  (3 rows)" in cli(capsys, filled, "export", "needle demo", "--out",
                                       str(tmp_path / "current"))[1]
    with pytest.raises(SystemExit) as refused:  # argparse's own exit 2
        cli(capsys, filled, "export", "needle demo", "--since", "yesterday")
    assert refused.value.code == 2 and "not an ISO date" in capsys.readouterr().err
