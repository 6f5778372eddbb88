"""Waiters of a board by priority: a table instead of the lease's one waiter slot (the next
lease goes to the highest priority, then the longest waiting; see db/leases.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


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


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("waiter", sa.String(200), nullable=True))
        batch.add_column(sa.Column("waiting_since", sa.DateTime(), nullable=True))
    op.drop_table("board_waiters")
