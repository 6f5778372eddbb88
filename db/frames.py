"""An experiment's raw rows as pandas DataFrames, behind ``Store.frames`` and
``Store.history_frame``: what the reports, export and a history across revisions read.

``frames`` reads the measurements db.measurements' ``Selection`` names with every column of
their runs, the rows those refer to, and their decode steps, outcomes and snapshots, its JSON
values as canonical JSON text (CSV/parquet-safe; each distinct stored value worked out once);
``history_frame`` reads only what a history needs of each run's current ok measurement, its
configs and parameters as documents. The listings and summaries the CLI shows are db.queries'.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Connection,
    Float,
    LargeBinary,
    Select,
    Text,
    cast,
    literal,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.orm import Session

from db.measurements import CURRENT, Selection, current_measurements
from db.models import (
    RUN_KEPT,
    Build,
    DecodeSteps,
    Device,
    DeviceSnapshot,
    Measurement,
    Model,
    OutcomeRow,
    Run,
    Workload,
)
from db.packing import STEP_TIMES, STEP_TOKENS, CompressedJSON
from db.queries import experiment_members, experiment_row
from db.records import AXIS_COLUMNS
from db.revisions import build_names
from db.rows import chunks

if TYPE_CHECKING:
    import pandas as pd


def _labelled(model: type, prefix: str, skip: tuple[str, ...] = ()) -> list[Any]:
    return [column.label(f"{prefix}_{column.key}") for column in model.__table__.columns
            if column.key not in skip and column.key != "id"]


def _is_json(column: Any) -> bool:
    return isinstance(column.type, JSON | CompressedJSON)


def _json_text(value: Any) -> str | None:
    """A JSON value as frames hold it: canonical JSON text (sorted keys); None for none."""
    return None if value is None else json.dumps(value, sort_keys=True)


class _Canonical:
    """Stored JSON (as the database holds it: text, or zlib-compressed bytes) as canonical
    text, each distinct stored value worked out once (a workload's parameters, a run's tokens
    and many snapshots repeat). The same text a JSON column's value gives: parsed, printed
    with sorted keys."""

    def __init__(self, compressed: bool = False) -> None:
        self.compressed = compressed
        self.seen: dict[Any, str | None] = {}

    def __call__(self, stored: Any) -> str | None:
        if stored is None:
            return None
        try:
            return self.seen[stored]
        except KeyError:
            pass
        except TypeError:  # a driver that hands over parsed values (unhashable)
            return _json_text(stored)
        value = json.loads(zlib.decompress(stored) if self.compressed else stored) \
            if isinstance(stored, str | bytes) else stored
        text = self.seen[stored] = _json_text(value)
        return text


def _stored(column: Any) -> Any:
    """A JSON column selected as the database holds it, for ``_Canonical`` (no parse on read)."""
    if isinstance(column.type, CompressedJSON):
        return type_coerce(column, LargeBinary).label(column.key)
    return cast(column, Text).label(column.key)


def _read(conn: Connection, query: Select, documents: bool = False) -> pd.DataFrame:
    """A DataFrame of ``query``; JSON columns become canonical JSON text (CSV/parquet-safe),
    each distinct stored value once; with ``documents`` they stay the parsed documents."""
    import pandas as pd  # only readers of frames need pandas (the CLI starts without it)

    columns = list(query.selected_columns)
    texts = {} if documents else {i: _Canonical(isinstance(c.type, CompressedJSON))
                                  for i, c in enumerate(columns) if _is_json(c)}
    if texts:
        query = query.with_only_columns(*(_stored(c) if i in texts else c
                                          for i, c in enumerate(columns)))
    result = conn.execute(query)
    names = list(result.keys())
    rows = [tuple(row) for row in result]  # plain tuples: pandas builds frames ~6x faster
    if texts:
        rows = [_with_texts(row, texts) for row in rows]
    return pd.DataFrame.from_records(rows, columns=names)


def _with_texts(row: Any, texts: dict[int, _Canonical]) -> list[Any]:
    """A row's values with its stored JSON values (at ``texts``' positions) as canonical text."""
    values = list(row)
    for i, canonical in texts.items():
        values[i] = canonical(values[i])
    return values


# The rows a run refers to, joined to it in frames: the prefix of their columns, the table and
# the columns left out (large, and available through get_run); the device's join is an inner
# one, the others outer
REFERENCES = (("device", Device, ()), ("build", Build, ()), ("model", Model, ("config",)),
              ("workload", Workload, ("ids",)))

def _reference_rows(conn: Connection, model: type, ids: set[Any],
                    skip: tuple[str, ...] = ()) -> dict[Any, tuple]:
    """id -> the row's columns (``_labelled``'s order, without id), JSON as canonical text:
    each referenced row read and printed once, however many runs refer to it."""
    table = model.__table__
    columns = [c for c in table.columns if c.key not in skip and c.key != "id"]
    found: dict[Any, tuple] = {}
    for batch in chunks(sorted(i for i in ids if i is not None)):
        for row_id, *values in conn.execute(select(table.c.id, *columns)
                                            .where(table.c.id.in_(batch))):
            found[row_id] = tuple(_json_text(v) if _is_json(c) else v
                                  for c, v in zip(columns, values, strict=True))
    return found


def frames(conn: Connection, experiment: str, selection: Selection = CURRENT,
           summaries: bool = False,
           boards: Collection[str] | None = None) -> dict[str, pd.DataFrame]:
    """The raw rows of an experiment as DataFrames, ordered by run id and measurement id.

    - ``runs``: one row per measurement that ``selection`` names (by default each run's
      current one) of every run that belongs to the experiment (also those another experiment
      produced, see models.ExperimentRun): every runs column (``id`` is the run's), every
      measurements column (``measurement_id``, ``attempt``, ``status``, timings ...), plus
      ``experiment`` (the name asked for), ``device_*``, ``build_*``, ``model_*`` and
      ``workload_*`` columns of the joined rows (workload ids and model config excluded: they
      are large and available through ``get_run``).
    - ``token_timings``, ``outcomes``, ``snapshots``: their tables, keyed by ``measurement_id``.
    JSON values (config, params, fingerprints, generated ids) are JSON text with sorted keys.
    With ``summaries`` the snapshots are their summaries instead of their fingerprints
    (db.rows.snapshot_summary: flags, CPU and load, as documents): what a report reads of
    every run (a nightly has 200,000 snapshots; ``snapshot_fingerprints`` reads the few whole
    documents it shows). With ``boards`` (device names or classes), only the measurements made
    on those devices (what a comparison of boards reads).

    The device, build, model and workload rows are read once each (a nightly's 50,000 runs
    share a few hundred) and joined here, as the inner join on the device and the outer joins
    on the others would.
    """
    import pandas as pd

    with Session(bind=conn) as session:
        exp_id = experiment_row(session, experiment).id
    chosen = current_measurements(selection, experiment_members(exp_id)).subquery()
    if boards is not None:
        on_boards = select(Device.id).where(or_(Device.name.in_(boards), Device.cls.in_(boards)))
        chosen = (select(chosen.c.run_id, chosen.c.measurement_id)
                  .join(Measurement, Measurement.id == chosen.c.measurement_id)
                  .where(Measurement.device_id.in_(on_boards)).subquery())
    ids = select(chosen.c.measurement_id)
    measured = [c.label("measurement_id") if c.key == "id" else c
                for c in Measurement.__table__.columns if c.key != "run_id"]
    planned = [c for c in Run.__table__.columns if c.key not in RUN_KEPT]
    texts = {i: _Canonical() for i, c in enumerate(planned) if _is_json(c)}
    query = (
        select(*(_stored(c) if i in texts else c for i, c in enumerate(planned)), *measured,
               literal(experiment).label("experiment"))
        .join(chosen, chosen.c.run_id == Run.id)
        .join(Measurement, Measurement.id == chosen.c.measurement_id)
        .order_by(Run.id, Measurement.id)
    )
    result = conn.execute(query)
    names = list(result.keys())
    rows = result.all()
    joined = []  # per table referred to: the column referring, its rows by id, a row of none
    for prefix, model, skip in REFERENCES:
        column = names.index(f"{prefix}_id")
        labels = [label.key for label in _labelled(model, prefix, skip)]
        found = _reference_rows(conn, model, {row[column] for row in rows}, skip)
        joined.append((column, found, (None,) * len(labels)))
        names += labels
    device_column, devices, _ = joined[0]
    records = []
    for row in rows:
        if row[device_column] not in devices:  # the inner join on the device
            continue
        values = _with_texts(row, texts)
        for column, found, none in joined:
            values += found.get(row[column], none)
        records.append(tuple(values))
    return {
        "runs": pd.DataFrame.from_records(records, columns=names),
        "token_timings": _steps_frame(conn, ids),
        "outcomes": _read(conn, select(OutcomeRow.__table__)
                          .where(OutcomeRow.measurement_id.in_(ids))
                          .order_by(OutcomeRow.measurement_id)),
        "snapshots": _read(conn, select(*_snapshot_columns(summaries))
                           .where(DeviceSnapshot.measurement_id.in_(ids))
                           .order_by(DeviceSnapshot.measurement_id, DeviceSnapshot.id),
                           documents=summaries),
    }


def _snapshot_columns(summaries: bool) -> list[Any]:
    """The snapshots' columns a frame holds: the summary or the fingerprint, never both."""
    left_out = "fingerprint" if summaries else "summary"
    return [c for c in DeviceSnapshot.__table__.columns if c.key != left_out]


def snapshot_fingerprints(conn: Connection, ids: Collection[int]) -> dict[int, Any]:
    """The fingerprint documents of the snapshots ``ids`` (snapshot id -> document)."""
    table = DeviceSnapshot.__table__
    return {snapshot: document for batch in chunks(sorted(ids))
            for snapshot, document in conn.execute(select(table.c.id, table.c.fingerprint)
                                                   .where(table.c.id.in_(batch)))}


STEP_COLUMNS = ["measurement_id", "step", "token", "ms", "attn_ms"]


def _steps_frame(conn: Connection, ids: Select) -> pd.DataFrame:
    """One row per decode step of the measurements ``ids`` names, unpacked (db.packing), in
    (measurement, step) order."""
    import numpy as np
    import pandas as pd

    table = DecodeSteps.__table__
    rows = conn.execute(select(table.c.measurement_id, table.c.steps, table.c.tokens,
                               table.c.ms, table.c.attn_ms)
                        .where(table.c.measurement_id.in_(ids))
                        .order_by(table.c.measurement_id)).all()
    if not rows:
        return pd.DataFrame(columns=STEP_COLUMNS)
    counts = [steps for _, steps, _, _, _ in rows]
    attn = [np.full(n, np.nan) if a is None else np.frombuffer(a, STEP_TIMES)
            for (_, n, _, _, a) in rows]
    frame = pd.DataFrame({
        "measurement_id": np.repeat([m for m, *_ in rows], counts),
        "step": np.concatenate([np.arange(n) for n in counts]),
        "token": np.concatenate([np.frombuffer(t, STEP_TOKENS) for _, _, t, _, _ in rows]
                                ).astype(np.int64),
        "ms": np.concatenate([np.frombuffer(ms, STEP_TIMES) for _, _, _, ms, _ in rows]),
        "attn_ms": np.concatenate(attn),
    })
    if frame["attn_ms"].isna().all():  # as a frame of the rows would hold them: None
        frame["attn_ms"] = pd.Series([None] * len(frame), dtype=object)
    return frame


def history_frame(conn: Connection, experiment: str) -> pd.DataFrame:
    """What a history across engine revisions reads of an experiment: one row per run whose
    current measurement is ok, with its device, engine revision (the build's revision and
    source hash), engine, axis columns and config, workload (kind, parameters), and its
    figures (measurement and outcome columns). Nothing else a report reads is selected: no
    raw output, decode steps, snapshots or generated ids; each workload's parameters are read
    once."""
    import pandas as pd

    with Session(bind=conn) as session:
        exp_id = experiment_row(session, experiment).id
    figures = [c for c in Measurement.__table__.columns
               if isinstance(c.type, Float) or c.key == "prompt_tokens"]
    outcome = [c for c in OutcomeRow.__table__.columns
               if isinstance(c.type, Float | BigInteger)]
    query = (
        select(Run.id.label("run_id"), literal(experiment).label("experiment"),
               Device.name.label("device"), Run.engine, Run.command, Run.workload_id,
               *(getattr(Run, name) for name in AXIS_COLUMNS), Run.config,
               Measurement.id.label("measurement_id"), Measurement.status, *figures, *outcome,
               Run.build_id, Build.source_hash.label("build_source_hash"), Run.model_id)
        .join(Measurement, Measurement.id == Run.current_measurement_id)
        .join(Device, Measurement.device_id == Device.id)
        .join(Build, Run.build_id == Build.id)
        .outerjoin(OutcomeRow, OutcomeRow.measurement_id == Measurement.id)
        .where(Run.id.in_(experiment_members(exp_id)), Measurement.status == "ok")
        .order_by(Run.id)
    )
    result = conn.execute(query)
    frame = pd.DataFrame.from_records([tuple(row) for row in result], columns=list(result.keys()))
    # a run of a binary is a run of every revision that builds it: one row per revision name
    configs = {mid: config for batch in chunks(sorted({int(i) for i in
                                                        frame["model_id"].dropna()}))
               for mid, config in conn.execute(select(Model.id, Model.config)
                                               .where(Model.id.in_(batch)))}
    frame["model_config"] = [configs.get(m) for m in frame["model_id"]]
    names, code = build_names(conn, frame["build_id"].dropna())
    frame["build_code_hash"] = [code.get(b) for b in frame["build_id"]]
    per_row = [names.get(b, [None]) for b in frame["build_id"]]
    frame = frame.loc[frame.index.repeat([len(n) for n in per_row])].reset_index(drop=True)
    frame["build_revision"] = [name for n in per_row for name in n]
    workloads = {wid: (kind, params)
                 for batch in chunks(sorted({int(i) for i in frame["workload_id"].dropna()}))
                 for wid, kind, params in conn.execute(
                     select(Workload.id, Workload.kind, Workload.params)
                     .where(Workload.id.in_(batch)))}
    frame["workload_kind"] = [workloads.get(w, (None, None))[0] for w in frame["workload_id"]]
    frame["workload_params"] = [workloads.get(w, (None, None))[1] for w in frame["workload_id"]]
    return frame
