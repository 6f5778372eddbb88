"""A year of runs: raw data kept smaller, and what reads derived from every row kept as rows land.

- ``token_timings`` (a row per decode step) becomes ``decode_steps`` (a row per measurement,
  the steps packed: db.packing); every value carried over.
- ``measurements.raw_json`` and ``device_snapshots.fingerprint`` are kept zlib-compressed
  (binary columns); every document carried over as it was.
- ``runs`` gets ``current_measurement_id``, ``status`` and ``attempts`` (each run's current
  measurement by the reads' rule, its status, its number of measurements), filled here; and
  ``experiment_counts`` each experiment's runs per status. From now on db.rows keeps them.
- An index on ``runs.build_id`` (a history reads runs by revision) and on
  ``measurements`` (device_id, id) (a board's latest attempt).
- ``experiments.writes``: how many times its runs' measurements were written, from now on
  (a cache key; db.rows keeps it).
- ``step_results``: the steps found in a history's series, kept by what they were found in.

The conversion runs in batches, in the migration's one transaction. The codec is db.packing's:
a change to its format is a migration of its own.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op

from db.packing import LEVEL, pack_steps
from db.records import TokenTiming

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BATCH = 2000
# literal, not db.records.RUN_STATUSES: a migration is history and keeps what it wrote
STATUSES = ("ok", "failed", "interrupted", "pending", "cancelled", "running", "lost")


def upgrade() -> None:
    bind = op.get_bind()
    _decode_steps(bind)
    _compress(bind, "measurements", "id", "raw_json", lambda text: text.encode())
    _compress(bind, "device_snapshots", "id", "fingerprint",
              lambda doc: json.dumps(_loaded(doc), separators=(",", ":")).encode())
    _current_measurements(bind)
    _experiment_counts(bind)
    op.create_index("ix_runs_build_id", "runs", ["build_id"])
    op.create_index("ix_measurements_device_id_id", "measurements", ["device_id", "id"])
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("writes", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "step_results",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("computed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_step_results"),
    )


def _decode_steps(bind: sa.Connection) -> None:
    op.create_table(
        "decode_steps",
        sa.Column("measurement_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.LargeBinary(), nullable=False),
        sa.Column("ms", sa.LargeBinary(), nullable=False),
        sa.Column("attn_ms", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(["measurement_id"], ["measurements.id"], ondelete="CASCADE",
                                name="fk_decode_steps_measurement_id_measurements"),
        sa.PrimaryKeyConstraint("measurement_id", name="pk_decode_steps"),
    )
    steps = sa.table("decode_steps", *(sa.column(c) for c in
                                       ("measurement_id", "steps", "tokens", "ms", "attn_ms")))
    for measurements in _key_batches(bind, "token_timings", "measurement_id"):
        by_measurement: dict[int, list[TokenTiming]] = {m: [] for m in measurements}
        for measurement, step, token, ms, attn_ms in bind.execute(sa.text(
                "SELECT measurement_id, step, token, ms, attn_ms FROM token_timings "
                "WHERE measurement_id IN :ids ORDER BY measurement_id, step").bindparams(
                sa.bindparam("ids", expanding=True)), {"ids": measurements}):
            timings = by_measurement[measurement]
            if step != len(timings):
                raise RuntimeError(f"migration 0009: measurement {measurement} has no step "
                                   f"{len(timings)} (its token_timings skip one)")
            timings.append(TokenTiming(step, int(token), float(ms),
                                       None if attn_ms is None else float(attn_ms)))
        bind.execute(sa.insert(steps), [{"measurement_id": m, **pack_steps(timings)}
                                        for m, timings in by_measurement.items()])
    op.drop_table("token_timings")


def _key_batches(bind: sa.Connection, table: str, key: str,
                 where: str = "") -> Iterator[list[int]]:
    """The distinct values of ``key`` in ``table`` (with ``where``), in order, a batch at a
    time: memory stays bounded however large the store."""
    last = None
    while True:
        after = "" if last is None else f"{key} > {int(last)}"
        condition = " AND ".join(c for c in (where, after) if c)
        batch = [row[0] for row in bind.exec_driver_sql(
            f"SELECT DISTINCT {key} FROM {table}" + (f" WHERE {condition}" if condition else "")
            + f" ORDER BY {key} LIMIT {BATCH}")]
        if not batch:
            return
        yield batch
        last = batch[-1]


def _loaded(doc: object) -> object:
    return json.loads(doc) if isinstance(doc, str | bytes) else doc


def _compress(bind: sa.Connection, table: str, key: str, column: str, encode) -> None:
    """``column`` of ``table`` as its zlib-compressed bytes (through a new column, then in its
    place)."""
    packed = f"{column}_packed"
    with op.batch_alter_table(table) as batch:
        batch.add_column(sa.Column(packed, sa.LargeBinary(), nullable=True))
    target = sa.table(table, sa.column(key), sa.column(packed))
    for keys in _key_batches(bind, table, key, f"{column} IS NOT NULL"):
        rows = bind.execute(sa.text(f"SELECT {key}, {column} FROM {table} WHERE {key} IN :keys")
                            .bindparams(sa.bindparam("keys", expanding=True)), {"keys": keys})
        bind.execute(sa.update(target).where(target.c[key] == sa.bindparam("row_key"))
                     .values({packed: sa.bindparam("value")}),
                     [{"row_key": row_key, "value": zlib.compress(encode(value), LEVEL)}
                      for row_key, value in rows])
    nullable = table == "measurements"  # a fingerprint is required, raw output may be absent
    with op.batch_alter_table(table) as batch:
        batch.drop_column(column)
        batch.alter_column(packed, new_column_name=column, existing_type=sa.LargeBinary(),
                           nullable=nullable)


def _current_measurements(bind: sa.Connection) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("current_measurement_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("status", sa.String(16), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default="0",
                                   nullable=False))
    # the reads' rule (db.measurements): the latest ok measurement made under a live lease,
    # else the latest
    op.execute(
        "UPDATE runs SET "
        "current_measurement_id = (SELECT COALESCE(MAX(CASE WHEN m.status = 'ok' AND "
        "NOT m.lease_expired THEN m.id END), MAX(m.id)) FROM measurements m "
        "WHERE m.run_id = runs.id), "
        "attempts = (SELECT COUNT(*) FROM measurements m WHERE m.run_id = runs.id)")
    op.execute("UPDATE runs SET status = (SELECT m.status FROM measurements m "
               "WHERE m.id = runs.current_measurement_id)")
    op.create_index("ix_runs_current_measurement_id", "runs", ["current_measurement_id"])


def _experiment_counts(bind: sa.Connection) -> None:
    op.create_table(
        "experiment_counts",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name="fk_experiment_counts_experiment_id_experiments"),
        sa.PrimaryKeyConstraint("experiment_id", "status", name="pk_experiment_counts"),
    )
    counted = {(experiment, status): n for experiment, status, n in bind.exec_driver_sql(
        "SELECT er.experiment_id, r.status, COUNT(*) FROM experiment_runs er "
        "JOIN runs r ON r.id = er.run_id WHERE r.status IS NOT NULL "
        "GROUP BY er.experiment_id, r.status")}
    experiments = [row[0] for row in bind.exec_driver_sql("SELECT id FROM experiments")]
    counts = sa.table("experiment_counts", sa.column("experiment_id"), sa.column("status"),
                      sa.column("runs"))
    rows = [{"experiment_id": e, "status": s, "runs": counted.get((e, s), 0)}
            for e in experiments for s in STATUSES]
    if rows:
        bind.execute(sa.insert(counts), rows)


def downgrade() -> None:
    raise NotImplementedError("0009 packs and compresses the raw data; there is no way back "
                              "short of a copy of the store from before")
