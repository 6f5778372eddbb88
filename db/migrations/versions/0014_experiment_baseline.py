"""Whether an experiment's exact-attention baseline fails its own workload, kept per experiment
for `benchfarm status`'s list: ``experiments.baseline`` holds the failures (reports.baseline's
phrases joined by "; ", "" when exact attention does its work) as they were at
``experiments.baseline_writes`` (the experiment's ``writes`` then). NULL for rows stored before:
`status` finds them out the first time it lists them, and keeps them.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("baseline", sa.Text(), nullable=True))
        batch.add_column(sa.Column("baseline_writes", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("baseline_writes")
        batch.drop_column("baseline")
