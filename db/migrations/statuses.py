"""Changing the run statuses the ``runs`` table's CHECK constraint allows, on every backend."""

from __future__ import annotations

from alembic import op


def set_run_statuses(old: str, new: str) -> None:
    """Replace ``status IN (old)`` by ``status IN (new)`` (SQL lists of quoted statuses)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint("ck_runs_status", "runs", type_="check")
        op.create_check_constraint("ck_runs_status", "runs", f"status IN ({new})")
        return
    # SQLite cannot alter a CHECK constraint, and rebuilding `runs` would cascade-delete its
    # child rows. A CHECK does not change how rows are stored, so the table's SQL text is
    # edited in place, the documented way (sqlite.org/lang_altertable.html, "other kinds of
    # table schema changes"): writable_schema, then a schema_version bump so that every open
    # connection re-reads the schema.
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar()
    bind.exec_driver_sql("PRAGMA writable_schema=ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table' AND name = 'runs'",
        (f"status IN ({old})", f"status IN ({new})"))
    bind.exec_driver_sql(f"PRAGMA schema_version={int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema=OFF")
