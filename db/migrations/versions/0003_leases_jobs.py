"""Board leases, the job queue, the lease of each run, and the run status "cancelled".

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# literal, not db.records.RUN_STATUSES (nor, below, db.models.JOB_STATES): a migration is
# history and keeps what it wrote
OLD_STATUSES = "'ok', 'failed', 'interrupted', 'pending'"
NEW_STATUSES = OLD_STATUSES + ", 'cancelled'"


def _set_run_statuses(old: str, new: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint("ck_runs_status", "runs", type_="check")
        op.create_check_constraint("ck_runs_status", "runs", f"status IN ({new})")
        return
    # SQLite cannot alter a CHECK constraint, and rebuilding `runs` would cascade-delete its
    # child rows. A CHECK does not change how rows are stored, so the table's SQL text is
    # edited in place, the documented way (sqlite.org/lang_altertable.html, "other kinds of
    # table schema changes"): writable_schema, then a schema_version bump so that every open
    # connection re-reads the schema.
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar()
    bind.exec_driver_sql("PRAGMA writable_schema=ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table' AND name = 'runs'",
        (f"status IN ({old})", f"status IN ({new})"))
    bind.exec_driver_sql(f"PRAGMA schema_version={int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema=OFF")


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("lease_id", sa.String(36), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("experiment", sa.String(200), nullable=True),
        sa.Column("run_key", sa.String(128), nullable=True),
        sa.Column("acquired", sa.DateTime(), nullable=False),
        sa.Column("heartbeat", sa.DateTime(), nullable=False),
        sa.Column("expires", sa.DateTime(), nullable=False),
        sa.Column("waiter", sa.String(200), nullable=True),
        sa.Column("waiting_since", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("board", name="pk_leases"),
        sa.UniqueConstraint("lease_id", name="uq_leases_lease_id"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(200), nullable=False),
        sa.Column("spec_path", sa.Text(), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=True),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("holder", sa.String(200), nullable=True),
        sa.Column("heartbeat", sa.DateTime(), nullable=True),
        sa.Column("totals", sa.JSON(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name="ck_jobs_state"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_experiment", "jobs", ["experiment"])
    op.create_index("ix_jobs_state_priority", "jobs", ["state", "priority"])
    op.add_column("runs", sa.Column("lease_id", sa.String(36), nullable=True))
    _set_run_statuses(OLD_STATUSES, NEW_STATUSES)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'cancelled'")
    _set_run_statuses(NEW_STATUSES, OLD_STATUSES)
    op.drop_column("runs", "lease_id")
    op.drop_table("jobs")
    op.drop_table("leases")
