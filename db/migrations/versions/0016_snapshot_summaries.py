"""``device_snapshots.summary``: the part of each snapshot that reports read of every run (its
flags, its CPU, its load before the run; db.rows.snapshot_summary), beside the compressed
fingerprint. A report, compare or audit of a nightly history read every fingerprint of its
runs to find them: at a thousand engine revisions, 200,000 documents decompressed and parsed
(11 s of the dashboard's first view of the experiment).

Filled here from each stored fingerprint, in batches, in the migration's one transaction, by
db.rows.snapshot_summary, as every snapshot stored since is. The column stays nullable in the
schema (every row has one): making it NOT NULL would copy the table on SQLite, 1.4 GB of free
pages left in a store of a million measurements.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.packing import CompressedJSON
from db.rows import snapshot_summary

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

BATCH = 2000


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("device_snapshots") as batch:
        batch.add_column(sa.Column("summary", sa.JSON(), nullable=True))
    snapshots = sa.table("device_snapshots", sa.column("id"),
                         sa.column("fingerprint", CompressedJSON()),
                         sa.column("summary", sa.JSON()))
    last = 0
    while True:
        rows = bind.execute(sa.select(snapshots.c.id, snapshots.c.fingerprint)
                            .where(snapshots.c.id > last).order_by(snapshots.c.id)
                            .limit(BATCH)).all()
        if not rows:
            break
        bind.execute(sa.update(snapshots).where(snapshots.c.id == sa.bindparam("row_id"))
                     .values(summary=sa.bindparam("value")),
                     [{"row_id": row_id, "value": snapshot_summary(fingerprint)}
                      for row_id, fingerprint in rows])
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("device_snapshots") as batch:
        batch.drop_column("summary")
