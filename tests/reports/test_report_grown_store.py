"""A report shows what its experiment holds, however much else the store holds: the same
experiment rendered from a store of its own runs and from one grown around it (other
experiments before and after it, on the same boards, builds and model) gives the same tables,
figures and text. Only the store's row ids differ (a run is shown by its id, as `benchfarm
reproduce ID` takes it): each is read back as its run's key before comparing."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
from fixtures_reports import SyntheticExperiment, build_record
from sqlalchemy import select

from db import Store
from db.models import Measurement, Run
from reports.render import render_report

SHOWN = "shown"


def fill_shown(store: Store) -> None:
    """The experiment the report shows: two engine revisions (a history with a step), two
    boards, exact and sparse at two contexts, repeats, a failed run."""
    exp = SyntheticExperiment(store, name=SHOWN, spec_text=f'name = "{SHOWN}"\n')
    exp.add_build("new", build_record(source_hash="b" * 64, revision="rev-b"))
    for build, slower in (("default", 0.0), ("new", 3.0)):
        for ctx in (256, 512):
            for k in (None, 8):
                for repeat in range(2):
                    exp.run(policy="exact" if k is None else "sparse", k=k, ctx=ctx,
                            repeat=repeat, build=build, decode_ms=10.0 + ctx / 256 + slower,
                            recall=1.0 if k is None or ctx == 256 else 0.0)
    exp.run(device="arm", ctx=256, decode_ms=80.0)
    exp.run(policy="sparse", k=2, status="failed")


def fill_other(store: Store, name: str, runs: int) -> None:
    """Another experiment on the same boards, builds and model."""
    exp = SyntheticExperiment(store, name=name, spec_text=f'name = "{name}"\n')
    exp.add_build("new", build_record(source_hash="b" * 64, revision="rev-b"))
    for i in range(runs):
        exp.run(device=("local", "arm", "board-3")[i % 3], policy="sparse", k=4 + i % 5,
                ctx=128 * (1 + i % 4), repeat=i, build=("default", "new")[i % 2],
                decode_ms=7.0 + i % 11, recall=(i % 3) / 2, status="failed" if i % 17 == 0
                else "ok")


def keys_of(store: Store) -> tuple[dict[int, str], dict[int, str]]:
    """run id -> run key, measurement id -> its run's key and attempt."""
    with store.database.connect() as conn:
        runs = dict(conn.execute(select(Run.id, Run.run_key)).all())
        measurements = {m: f"{runs[r]}#{a}" for m, r, a in conn.execute(
            select(Measurement.id, Measurement.run_id, Measurement.attempt))}
    return runs, measurements


# where a report shows a run by its id: a reproduce command, the failures table's first cell
# (markdown and HTML)
SHOWN_IDS = re.compile(r"(reproduce |^\| |<tr><td>)(\d+)\b", re.MULTILINE)


def report_files(store: Store, out: Path) -> dict[str, object]:
    """The report's files, each store id read back as its run's key (the manifest's own hashes
    of the files left out: the files are compared themselves)."""
    runs, measurements = keys_of(store)
    index = render_report(store, SHOWN, out)
    files: dict[str, object] = {}
    for path in sorted(index.parent.iterdir()):
        text = path.read_text()
        if path.suffix == ".csv":
            table = pd.read_csv(io.StringIO(text), keep_default_na=False)
            for column, keys in (("run_id", runs), ("measurement_id", measurements)):
                if column in table:
                    table[column] = [keys[int(i)] for i in table[column]]
            files[path.name] = table.to_dict("list")
            continue
        text = SHOWN_IDS.sub(lambda m: m.group(1) + runs[int(m.group(2))], text)
        if path.name == "manifest.json":
            document = json.loads(text)
            del document["files"]
            files[path.name] = document
        else:
            files[path.name] = text
    return files


def test_a_report_is_the_same_in_a_small_store_and_a_grown_one(tmp_path: Path) -> None:
    small = Store.open(f"sqlite:///{tmp_path}/small.db")
    fill_shown(small)
    grown = Store.open(f"sqlite:///{tmp_path}/grown.db")
    for n in range(3):
        fill_other(grown, f"before-{n}", 60)
    fill_shown(grown)
    for n in range(2):
        fill_other(grown, f"after-{n}", 60)
    assert grown.count_runs() > 5 * small.count_runs()
    # the shown runs have other ids in the grown store: the comparison reads them as keys
    assert keys_of(small)[0] != {i: k for i, k in keys_of(grown)[0].items() if
                                 k.startswith(SHOWN)}
    shown_small = report_files(small, tmp_path / "small")
    shown_grown = report_files(grown, tmp_path / "grown")
    assert sorted(shown_small) == sorted(shown_grown)
    assert {"runs.csv", "timings.csv", "history_steps.csv", "index.html"} <= set(shown_small)
    for name in shown_small:
        assert shown_small[name] == shown_grown[name], name
    small.close()
    grown.close()
