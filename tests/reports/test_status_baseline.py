"""`benchfarm status`'s list flags an experiment whose exact-attention baseline fails its own
workload, from what each experiment keeps (``experiments.baseline``), found again only once its
runs changed: a real SQLite store, the real CLI."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fixtures_reports import SyntheticExperiment
from sqlalchemy import select, update

from db import Store
from db.models import Experiment
from harness.cli import main
from harness.commands.status import FAILED


def _rows(out: str) -> dict[str, list[str]]:
    """The list's rows by experiment name (the table's lines after its rule)."""
    table = out.split("\n\n")[0].splitlines()
    return {line.split()[0]: line.split() for line in table[2:] if line.split()}


def _listed(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, list[str]], str]:
    assert main(["--db", url, "status"]) == 0
    out = capsys.readouterr().out
    return _rows(out), out


def _kept(store: Store, name: str) -> tuple[str | None, int | None, int]:
    with store.session() as s:
        row = s.execute(select(Experiment.baseline, Experiment.baseline_writes,
                               Experiment.writes).where(Experiment.name == name)).one()
    return row.baseline, row.baseline_writes, row.writes


def test_the_list_flags_an_experiment_whose_exact_baseline_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/list.db"
    with Store.open(url) as store:
        broken = SyntheticExperiment(store, name="broken", spec_text='name = "broken"\n')
        healthy = SyntheticExperiment(store, name="healthy", spec_text='name = "healthy"\n')
        for repeat in range(2):
            broken.run(ctx=256, repeat=repeat, recall=0.0)  # the answer cut off, exact too
            broken.run(ctx=256, repeat=repeat, policy="sparse", k=8, recall=0.0)
            healthy.run(ctx=256, repeat=repeat, recall=1.0)
            healthy.run(ctx=256, repeat=repeat, policy="sparse", k=1, recall=0.0)  # news only
        assert _kept(store, "broken")[0] is None  # nothing found out before a list asks

    rows, out = _listed(url, capsys)
    assert rows["broken"][-1] == FAILED and rows["healthy"][-1] == "-"
    assert f"{FAILED}: exact attention, the baseline, fails its own workload" in out
    with Store.open(url) as store:
        baseline, found_at, writes = _kept(store, "broken")
        assert baseline == "local generate: recall 0.00" and found_at == writes
        assert _kept(store, "healthy")[:2] == ("", _kept(store, "healthy")[2])
        # the list reads what is kept while no run lands: a kept verdict is what it shows
        with store.writer.begin() as conn:
            conn.execute(update(Experiment.__table__).where(Experiment.name == "healthy")
                         .values(baseline="planted"))
    rows, _ = _listed(url, capsys)
    assert rows["healthy"][-1] == FAILED

    with Store.open(url) as store:  # exact recalls now: the kept verdict is stale, found again
        store_broken = SyntheticExperiment(store, name="broken", spec_text='name = "broken"\n')
        for repeat in range(2, 6):
            store_broken.run(ctx=256, repeat=repeat, recall=1.0)
    rows, _ = _listed(url, capsys)
    assert rows["broken"][-1] == "-"
    with Store.open(url) as store:
        baseline, found_at, writes = _kept(store, "broken")
        assert baseline == "" and found_at == writes


def test_a_perplexity_no_model_gives_is_flagged(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/ppl.db"
    with Store.open(url) as store:
        SyntheticExperiment(store).run(kind="ppl", ctx=64, ppl=5.0e4, recall=None)
    rows, _ = _listed(url, capsys)
    assert rows["synthetic"][-1] == FAILED



def test_a_read_keeps_the_verdict_only_when_the_store_takes_the_write_at_once(
        tmp_path: Path) -> None:
    """What the list finds is only a cache: while another process holds SQLite's write lock,
    the read's keep gives up at once (no busy wait, no retries, no error) and keeps nothing;
    with the lock free it keeps the verdict."""
    url = f"sqlite:///{tmp_path}/held.db"
    with Store.open(url) as store:
        SyntheticExperiment(store, name="broken", spec_text='name = "broken"\n').run(
            ctx=256, repeat=0, recall=0.0)
        writes = _kept(store, "broken")[2]
        holder = sqlite3.connect(tmp_path / "held.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert not store.keep_baseline_unless_busy("broken", writes, "found while held")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert _kept(store, "broken")[:2] == (None, None)
        assert store.keep_baseline_unless_busy("broken", writes, "found")
        assert _kept(store, "broken")[:2] == ("found", writes)
