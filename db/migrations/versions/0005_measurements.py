"""Append-only measurements: a run (the planned cell) keeps its identity in ``runs``; what each
attempt measured moves to ``measurements`` (one per attempt), and the child rows (token
timings, outcomes, device snapshots) belong to a measurement.

Every existing run becomes a run with one measurement (attempt 1, with the same id as the run,
so the child rows keep their keys), its columns carried over unchanged. The board
(``device_id``) moves with it: a pooled run's attempts may run on different boards. The
``attempts`` count of board-loss retries is not carried: each try is now a measurement of its
own.

Revision ID: 0005_measurements (not "0005": stores migrated before the renumbering hold
"0005" for today's 0004, which db.connection restamps)
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_measurements"
down_revision = "0004"
branch_labels = None
depends_on = None

MOVED = ("device_id", "status", "exit_code", "error", "started_at", "finished_at", "wall_ms",
         "engine_ms", "overhead_ms", "prefill_ms", "decode_ms_per_token", "attn_ms_per_token",
         "prompt_tokens", "raw_json", "lease_id")
# literal, not db.records.RUN_STATUSES: a migration is history and keeps what it wrote
STATUSES = "'ok', 'failed', 'interrupted', 'pending', 'cancelled', 'running', 'lost'"
CHILDREN = ("token_timings", "outcomes", "device_snapshots")


def upgrade() -> None:
    # On SQLite db.connection.migrate runs this with foreign keys off (the documented way to
    # rebuild tables: dropping `runs` would otherwise cascade-delete its children); the check
    # at the end proves every reference still resolves.
    bind = op.get_bind()
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("wall_ms", sa.Float(), nullable=True),
        sa.Column("engine_ms", sa.Float(), nullable=True),
        sa.Column("overhead_ms", sa.Float(), nullable=True),
        sa.Column("prefill_ms", sa.Float(), nullable=True),
        sa.Column("decode_ms_per_token", sa.Float(), nullable=True),
        sa.Column("attn_ms_per_token", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("raw_json", sa.Text(), nullable=True),
        sa.Column("lease_id", sa.String(36), nullable=True),
        sa.Column("lease_expired", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.CheckConstraint(f"status IN ({STATUSES})", name="ck_measurements_status"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE",
                                name="fk_measurements_run_id_runs"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"],
                                name="fk_measurements_device_id_devices"),
        sa.PrimaryKeyConstraint("id", name="pk_measurements"),
        sa.UniqueConstraint("run_id", "attempt", name="uq_measurements_run_id_attempt"),
    )
    op.create_index("ix_measurements_status", "measurements", ["status"])
    moved = ", ".join(MOVED)
    op.execute(f"INSERT INTO measurements (id, run_id, attempt, {moved}) "
               f"SELECT id, id, 1, {moved} FROM runs")
    if bind.dialect.name == "postgresql":
        op.execute("SELECT setval(pg_get_serial_sequence('measurements', 'id'), "
                   "COALESCE((SELECT MAX(id) FROM measurements), 0) + 1, false)")
    op.drop_index("ix_device_snapshots_run_id", "device_snapshots")
    if bind.dialect.name == "sqlite":
        for child, columns in _children().items():
            _rebuild(child, columns)
    else:
        for child in CHILDREN:
            op.drop_constraint(f"fk_{child}_run_id_runs", child, type_="foreignkey")
            op.alter_column(child, "run_id", new_column_name="measurement_id")
            op.create_foreign_key(f"fk_{child}_measurement_id_measurements", child,
                                  "measurements", ["measurement_id"], ["id"], ondelete="CASCADE")
    op.create_index("ix_device_snapshots_measurement_id", "device_snapshots",
                    ["measurement_id"])
    op.drop_index("ix_runs_experiment_id_status", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.drop_constraint("fk_runs_device_id_devices", type_="foreignkey")
        for column in ("attempts", *MOVED):
            batch.drop_column(column)
    op.create_index("ix_runs_experiment_id", "runs", ["experiment_id"])
    if bind.dialect.name == "sqlite":
        broken = bind.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"migration 0005 left dangling references: {broken[:5]}")


def _children() -> dict[str, list[sa.Column]]:
    """The child tables as they are from 0005 on: keyed by ``measurement_id``."""
    return {
        "token_timings": [
            sa.Column("measurement_id", sa.Integer(), nullable=False),
            sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("token", sa.Integer(), nullable=False),
            sa.Column("ms", sa.Float(), nullable=False),
            sa.Column("attn_ms", sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint("measurement_id", "step", name="pk_token_timings"),
        ],
        "outcomes": [
            sa.Column("measurement_id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("generated_ids", sa.JSON(), nullable=True),
            sa.Column("text", sa.Text(), nullable=True),
            sa.Column("expected_answer", sa.Text(), nullable=True),
            sa.Column("recall", sa.Float(), nullable=True),
            sa.Column("nll", sa.Float(), nullable=True),
            sa.Column("ppl", sa.Float(), nullable=True),
            sa.Column("selection_mass", sa.Float(), nullable=True),
            sa.Column("oracle_recall", sa.Float(), nullable=True),
            sa.Column("max_abs_diff", sa.Float(), nullable=True),
            sa.Column("bytes_read", sa.BigInteger(), nullable=True),
            sa.Column("attn_median_ms", sa.Float(), nullable=True),
            sa.Column("extra", sa.JSON(), nullable=False),
            sa.PrimaryKeyConstraint("measurement_id", name="pk_outcomes"),
        ],
        "device_snapshots": [
            sa.Column("id", sa.Integer(), nullable=False),
            sa.Column("measurement_id", sa.Integer(), nullable=False),
            sa.Column("phase", sa.String(16), nullable=False),
            sa.Column("taken_at", sa.DateTime(), nullable=True),
            sa.Column("fingerprint", sa.JSON(), nullable=False),
            sa.PrimaryKeyConstraint("id", name="pk_device_snapshots"),
        ],
    }


def _rebuild(child: str, columns: list[sa.Column]) -> None:
    """SQLite: the child table anew with ``measurement_id`` (the old ``run_id``, whose values
    are the measurement ids) referring to measurements; rows copied in column order."""
    op.create_table(f"{child}_0005", *columns, sa.ForeignKeyConstraint(
        ["measurement_id"], ["measurements.id"], ondelete="CASCADE",
        name=f"fk_{child}_measurement_id_measurements"))
    op.execute(f"INSERT INTO {child}_0005 SELECT * FROM {child}")
    op.drop_table(child)
    op.rename_table(f"{child}_0005", child)


def downgrade() -> None:
    raise NotImplementedError("0005 cannot be undone without dropping measurements: restore "
                              "the store's backup from before the upgrade instead")
