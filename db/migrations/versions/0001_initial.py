"""The initial schema: experiments, devices, builds, models, workloads, runs and their rows.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _fk(column: str, table: str, source: str, cascade: bool = False) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{table}.id"], name=f"fk_{source}_{column}_{table}",
        ondelete="CASCADE" if cascade else None,
    )


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_experiments"),
        sa.UniqueConstraint("name", name="uq_experiments_name"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("arch", sa.String(32), nullable=False),
        sa.Column("cls", sa.String(100), nullable=False),
        sa.Column("emulated", sa.Boolean(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("name", name="uq_devices_name"),
    )
    op.create_table(
        "builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(32), nullable=False),
        sa.Column("variant", sa.String(32), nullable=False),
        sa.Column("toolchain", sa.String(32), nullable=False),
        sa.Column("compiler", sa.String(200), nullable=False),
        sa.Column("compiler_version", sa.String(500), nullable=False),
        sa.Column("cflags", sa.JSON(), nullable=False),
        sa.Column("ldflags", sa.JSON(), nullable=False),
        sa.Column("source_hash", sa.String(128), nullable=False),
        sa.Column("revision", sa.String(128), nullable=False),
        sa.Column("build_key", sa.String(128), nullable=True),
        sa.Column("binary", sa.Text(), nullable=False),
        sa.Column("binary_sha256", sa.String(64), nullable=False),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_builds"),
        sa.UniqueConstraint("binary_sha256", "target", name="uq_builds_binary_sha256_target"),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("path", "sha256", name="uq_models_path_sha256"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("content_hash", sa.String(128), nullable=False),
        sa.Column("ids", sa.JSON(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("needle_span", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
        sa.UniqueConstraint("content_hash", name="uq_workloads_content_hash"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(128), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=True),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("command", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("policy", sa.String(32), nullable=True),
        sa.Column("k", sa.Integer(), nullable=True),
        sa.Column("block", sa.Integer(), nullable=True),
        sa.Column("probes", sa.Integer(), nullable=True),
        sa.Column("kv", sa.String(16), nullable=True),
        sa.Column("wq", sa.String(16), nullable=True),
        sa.Column("threads", sa.Integer(), nullable=True),
        sa.Column("prefill_attn", sa.String(32), nullable=True),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("wall_ms", sa.Float(), nullable=True),
        sa.Column("engine_ms", sa.Float(), nullable=True),
        sa.Column("overhead_ms", sa.Float(), nullable=True),
        sa.Column("prefill_ms", sa.Float(), nullable=True),
        sa.Column("decode_ms_per_token", sa.Float(), nullable=True),
        sa.Column("attn_ms_per_token", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("raw_json", sa.Text(), nullable=True),
        # literal, not db.records.RUN_STATUSES: a migration is history and keeps what it wrote
        sa.CheckConstraint(
            "status IN ('ok', 'failed', 'interrupted', 'pending')", name="ck_runs_status"
        ),
        _fk("experiment_id", "experiments", "runs"),
        _fk("device_id", "devices", "runs"),
        _fk("build_id", "builds", "runs"),
        _fk("model_id", "models", "runs"),
        _fk("workload_id", "workloads", "runs"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("run_key", name="uq_runs_run_key"),
    )
    op.create_index("ix_runs_experiment_id_status", "runs", ["experiment_id", "status"])
    op.create_table(
        "device_snapshots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=True),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        _fk("run_id", "runs", "device_snapshots", cascade=True),
        sa.PrimaryKeyConstraint("id", name="pk_device_snapshots"),
    )
    op.create_index("ix_device_snapshots_run_id", "device_snapshots", ["run_id"])
    op.create_table(
        "token_timings",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("token", sa.Integer(), nullable=False),
        sa.Column("ms", sa.Float(), nullable=False),
        sa.Column("attn_ms", sa.Float(), nullable=True),
        _fk("run_id", "runs", "token_timings", cascade=True),
        sa.PrimaryKeyConstraint("run_id", "step", name="pk_token_timings"),
    )
    op.create_table(
        "outcomes",
        sa.Column("run_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("generated_ids", sa.JSON(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("expected_answer", sa.Text(), nullable=True),
        sa.Column("recall", sa.Float(), nullable=True),
        sa.Column("nll", sa.Float(), nullable=True),
        sa.Column("ppl", sa.Float(), nullable=True),
        sa.Column("selection_mass", sa.Float(), nullable=True),
        sa.Column("oracle_recall", sa.Float(), nullable=True),
        sa.Column("max_abs_diff", sa.Float(), nullable=True),
        sa.Column("bytes_read", sa.BigInteger(), nullable=True),
        sa.Column("attn_median_ms", sa.Float(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        _fk("run_id", "runs", "outcomes", cascade=True),
        sa.PrimaryKeyConstraint("run_id", name="pk_outcomes"),
    )


def downgrade() -> None:
    for table in ("outcomes", "token_timings", "device_snapshots", "runs", "workloads",
                  "models", "builds", "devices", "experiments"):
        op.drop_table(table)
