"""Running a lab: board states and their history, health checks, reservations; a job's
notification targets and who cancelled it.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005_measurements"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "board_states",
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        # literal, not db.models.BOARD_STATES: a migration is history and keeps what it wrote
        sa.CheckConstraint("state IN ('online', 'maintenance', 'retired', 'bad')",
                           name="ck_board_states_state"),
        sa.PrimaryKeyConstraint("board", name="pk_board_states"),
    )
    op.create_table(
        "board_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("changed_by", sa.String(200), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_board_events"),
    )
    op.create_index("ix_board_events_board", "board_events", ["board"])
    op.create_table(
        "health_checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("items", sa.JSON(), nullable=False),
        sa.Column("checked_by", sa.String(200), nullable=False),
        sa.Column("checked_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_health_checks"),
    )
    op.create_index("ix_health_checks_board", "health_checks", ["board"])
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("starts", sa.DateTime(), nullable=False),
        sa.Column("ends", sa.DateTime(), nullable=False),
        sa.Column("released_at", sa.DateTime(), nullable=True),
        sa.Column("released_by", sa.String(200), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_board", "reservations", ["board"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("notify", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("cancelled_by", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancelled_by")
        batch.drop_column("notify")
    op.drop_table("reservations")
    op.drop_table("health_checks")
    op.drop_table("board_events")
    op.drop_table("board_states")
