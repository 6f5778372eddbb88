"""Regressions a lab acts on: every revision name a build was registered under
(``build_revisions``: revisions that share a binary all find its runs), alerts grouped per
culprit commit with the steps they hold and who changed their state (``alerts``,
``alert_steps``, ``alert_changes``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "build_revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"],
                                name="fk_build_revisions_build_id_builds"),
        sa.PrimaryKeyConstraint("id", name="pk_build_revisions"),
        sa.UniqueConstraint("build_id", "revision", name="uq_build_revisions_build_id_revision"),
    )
    op.create_index("ix_build_revisions_revision", "build_revisions", ["revision"])
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(200), nullable=False),
        sa.Column("revision", sa.String(128), nullable=False),
        sa.Column("previous", sa.String(128), nullable=True),
        sa.Column("subject", sa.String(500), nullable=False),
        sa.Column("authored_at", sa.String(40), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        # literal, not db.models.ALERT_STATES: a migration is history and keeps what it wrote
        sa.CheckConstraint("state IN ('untriaged', 'acknowledged', 'invalid', 'wontfix', "
                           "'fixed', 'fix-suggested')", name="ck_alerts_state"),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.UniqueConstraint("experiment", "revision", name="uq_alerts_experiment_revision"),
    )
    op.create_table(
        "alert_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(200), nullable=False),
        sa.Column("config", sa.String(500), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("before", sa.Float(), nullable=False),
        sa.Column("after", sa.Float(), nullable=False),
        sa.Column("ratio", sa.Float(), nullable=True),
        sa.Column("regression", sa.Boolean(), nullable=False),
        sa.Column("back_at", sa.String(128), nullable=True),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"],
                                name="fk_alert_steps_alert_id_alerts"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_steps"),
        sa.UniqueConstraint("alert_id", "device", "config", "metric",
                            name="uq_alert_steps_alert_id_device_config_metric"),
    )
    op.create_table(
        "alert_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("checked", sa.Boolean(), nullable=False),
        sa.Column("state_from", sa.String(16), nullable=True),
        sa.Column("state_to", sa.String(16), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"],
                                name="fk_alert_changes_alert_id_alerts"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_changes"),
    )
    op.create_index("ix_alert_changes_alert_id", "alert_changes", ["alert_id"])


def downgrade() -> None:
    op.drop_index("ix_alert_changes_alert_id", "alert_changes")
    op.drop_table("alert_changes")
    op.drop_table("alert_steps")
    op.drop_table("alerts")
    op.drop_index("ix_build_revisions_revision", "build_revisions")
    op.drop_table("build_revisions")
