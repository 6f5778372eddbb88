"""The instruction-set level a build was made for (``builds.isa``: devices.isa's level names,
e.g. ``v4-vnni`` or ``armv8-a``); NULL for builds stored before there were levels.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("builds") as batch:
        batch.add_column(sa.Column("isa", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("builds") as batch:
        batch.drop_column("isa")
