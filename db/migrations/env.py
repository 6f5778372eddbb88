"""Alembic environment for the result store.

Run programmatically by :meth:`db.store.Store.open`, which passes an open connection in
``config.attributes["connection"]``; there is no alembic.ini. To write a new revision, see
db/README.md.
"""

from __future__ import annotations

from alembic import context

from db.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "db/migrations runs through db.store.Store.open (or db.connection.migrate), which passes a "
        "connection"
    )

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place; batch mode recreates the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
