"""The memory a run took: the process's peak resident set and the KV cache's bytes reserved
and touched (lmc's ``peak_rss_kb`` and ``kv_memory``), columns of its outcome; NULL for runs
stored before (their figures, if any, stay in ``extra``) and for engines that print none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("peak_rss_kb", "kv_allocated_bytes", "kv_resident_bytes")


def upgrade() -> None:
    with op.batch_alter_table("outcomes") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outcomes") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
