"""Experiment membership of runs: a run shared by two experiments belongs to both.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiment_runs",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name="fk_experiment_runs_experiment_id_experiments"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE",
                                name="fk_experiment_runs_run_id_runs"),
        sa.PrimaryKeyConstraint("experiment_id", "run_id", name="pk_experiment_runs"),
    )
    op.create_index("ix_experiment_runs_run_id", "experiment_runs", ["run_id"])
    # Every existing run belongs to the experiment that produced it.
    op.execute("INSERT INTO experiment_runs (experiment_id, run_id) "
               "SELECT experiment_id, id FROM runs")


def downgrade() -> None:
    op.drop_table("experiment_runs")
