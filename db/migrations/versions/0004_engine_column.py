"""Which engine a build and a run belong to (lmc, llama-bench ...); existing rows are lmc's.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLES = ("builds", "runs")


def upgrade() -> None:
    # server_default fills the rows written before there was a second engine
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("engine", sa.String(32), nullable=False,
                                       server_default="lmc"))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("engine")
