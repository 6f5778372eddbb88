"""Waiters of a board by priority (a table instead of the lease's one waiter), and the run
status "lost" (its board's node or runner was lost while it was in flight).

Revision ID: 0007
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.migrations.statuses import set_run_statuses

revision = "0007"
down_revision = "0004"
branch_labels = None
depends_on = None

OLD_STATUSES = "'ok', 'failed', 'interrupted', 'pending', 'cancelled'"
NEW_STATUSES = OLD_STATUSES + ", 'lost'"


def upgrade() -> None:
    op.create_table(
        "board_waiters",
        sa.Column("board", sa.String(200), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.Column("seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("board", "holder", name="pk_board_waiters"),
    )
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("waiter")
        batch.drop_column("waiting_since")
    set_run_statuses(OLD_STATUSES, NEW_STATUSES)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'pending' WHERE status = 'lost'")
    set_run_statuses(NEW_STATUSES, OLD_STATUSES)
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("waiter", sa.String(200), nullable=True))
        batch.add_column(sa.Column("waiting_since", sa.DateTime(), nullable=True))
    op.drop_table("board_waiters")
