"""An index on ``measurements.finished_at``: the dashboard's board timelines read the attempts
that touch the last 24 hours (finished since then, or not finished), which without it is a
scan of every measurement (at a million: 290 ms of each `/` and `/api/timeline` request).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_measurements_finished_at", "measurements", ["finished_at"])


def downgrade() -> None:
    op.drop_index("ix_measurements_finished_at", table_name="measurements")
