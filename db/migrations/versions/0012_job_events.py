"""Every job tells its story: ``job_events`` (each transition of a job with its time, who caused
it and why) and ``measurements.job_id`` (the job whose coordinator made an attempt). The events
of jobs stored before are made from what their rows kept: submitted, started, ended.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

EVENTS = ("'submitted', 'claimed', 'taken over', 'waiting', 'drained', 'requeued', "
          "'interrupted', 'cancelled', 'finished', 'lost'")


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(200), nullable=True),
        sa.Column("cause", sa.Text(), nullable=True),
        sa.CheckConstraint(f"event IN ({EVENTS})", name="ck_job_events_event"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE",
                                name="fk_job_events_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
    op.create_index("ix_measurements_job_id", "measurements", ["job_id"])
    # the stories of the jobs stored so far, from their rows
    op.execute("INSERT INTO job_events (job_id, at, event, actor, cause) "
               "SELECT id, submitted_at, 'submitted', owner, 'stored before job events' "
               "FROM jobs")
    op.execute("INSERT INTO job_events (job_id, at, event, actor, cause) "
               "SELECT id, started_at, 'claimed', holder, 'stored before job events' "
               "FROM jobs WHERE started_at IS NOT NULL")
    op.execute("INSERT INTO job_events (job_id, at, event, actor, cause) "
               "SELECT id, finished_at, CASE WHEN state = 'cancelled' THEN 'cancelled' "
               "ELSE 'finished' END, cancelled_by, message "
               "FROM jobs WHERE finished_at IS NOT NULL")


def downgrade() -> None:
    op.drop_index("ix_measurements_job_id", "measurements")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("job_id")
    op.drop_index("ix_job_events_job_id", "job_events")
    op.drop_table("job_events")
