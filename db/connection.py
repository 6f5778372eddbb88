"""Connecting to the store's database and migrating its schema.

This is the database side of the store: ``connect_database`` turns a URL into the database the
store holds (a SQLAlchemy ``Engine``, called the database here, as "engine" names the inference
engines; SQLite: WAL, foreign keys, transactional DDL); ``migrate`` runs the Alembic migrations
in ``db/migrations`` on it, without an alembic.ini.
"""

from __future__ import annotations

import functools
import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, ExceptionContext, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    InterfaceError,
    InternalError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.pool import StaticPool

from db.errors import StoreError, StoreInputError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Revision ids the migrations had before they were numbered 0001-0004 without gaps: a store
# stamped with one is restamped with its new id before the upgrade (same schema, new name).
RENAMED_REVISIONS = {"0003b": "0003", "0005": "0004"}
# SQLite result codes of a file that was a store and no longer works: corrupted, disk full, I/O.
SQLITE_DAMAGE = ("SQLITE_CORRUPT", "SQLITE_FULL", "SQLITE_IOERR")
# Execution option naming the statement that opens a SQLite transaction (see migrate).
SQLITE_BEGIN = "benchfarm_sqlite_begin"
# How long a SQLite statement waits for another process's write lock before it gives up, and
# how many times a whole transaction is then retried (see retry_locked).
BUSY_TIMEOUT_S = 10.0
LOCKED_RETRIES = 5
P = ParamSpec("P")
R = TypeVar("R")


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # The sqlite3 module opens transactions only before INSERT/UPDATE/DELETE, so DDL (the
    # migrations) would run outside them. Switch that off; _sqlite_begin emits BEGIN instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: readers (reports) never block the single writer (the coordinator) and vice versa.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    # NORMAL is durable across application crashes in WAL mode; only an OS crash may lose the
    # last commits, never corrupt the file.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class SqliteFile:
    """The file a SQLite store opened, by device and inode, and by its real path: a file
    deleted or replaced under a running store would take every later write with it (into the
    unlinked inode) while the run reported success, and so would a store named through a
    symlinked folder that is switched to another target (the open connections write on into
    the old one). So each new connection and each commit checks that the path as given still
    resolves to the real path first opened and is still the file first opened, and fails with
    exit 1 otherwise."""

    def __init__(self, path: Path, shown: str) -> None:
        self.path, self.shown = path, shown  # absolute, symlinks kept: what the user named
        self.identity: tuple[int, int] | None = None
        self.real: str | None = None

    def check(self) -> None:
        real = os.path.realpath(self.path)
        if self.real is None:
            self.real = real
        elif real != self.real:
            raise StoreError(f"--db {self.shown}: the store's path {self.path} now leads to "
                             f"{real}, not to {self.real} (a symlink switched while in use); "
                             "nothing more was written")
        try:
            info = os.stat(self.path)
        except OSError:
            raise StoreError(f"--db {self.shown}: the store's file {self.path} is gone (deleted "
                             "or moved while in use); nothing more was written, and what this "
                             "run wrote since is lost; restore the file or start again") from None
        identity = (info.st_dev, info.st_ino)
        if self.identity is None:
            self.identity = identity
        elif identity != self.identity:
            raise StoreError(f"--db {self.shown}: the store's file {self.path} was replaced by "
                             "another file while in use; nothing more was written to it")

    def on_connect(self, _dbapi_connection: Any, _record: Any) -> None:
        self.check()

    def on_commit(self, _connection: Connection) -> None:
        self.check()


def _sqlite_begin(connection: Connection) -> None:
    connection.exec_driver_sql(connection.get_execution_options().get(SQLITE_BEGIN, "BEGIN"))


# Any failure of the database below the store, for a reader that keeps going after one (the
# dashboard): the store makes most of them a StoreError, but a read may still raise this.
DatabaseFailure = SQLAlchemyError


def shown_url(url: str) -> str | None:
    """``url`` as messages show it, without its password; None when it is no SQLAlchemy URL."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return None


def connect_database(url: str, create: bool = True) -> Engine:
    """The database at ``url`` (a SQLAlchemy Engine); bad URLs, unknown drivers and missing
    directories are input errors.

    With ``create=False`` a SQLite file that does not exist is an input error too (read-only
    commands should not leave an empty database behind).
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreInputError(
            f"--db {url!r} is not a SQLAlchemy URL ({exc}); "
            "examples: sqlite:///benchfarm.db, postgresql+psycopg://user@127.0.0.1/benchfarm"
        ) from exc
    shown = parsed.render_as_string(hide_password=True)
    options: dict[str, Any] = {}
    watched: SqliteFile | None = None
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite:
        database = parsed.database or ""
        if database in ("", ":memory:"):
            # One shared connection, or every connection would see its own empty database.
            options = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        else:
            options = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
        if database not in ("", ":memory:") and not database.startswith("file:"):
            path = Path(os.path.abspath(Path(database).expanduser()))
            if not create and not path.is_file():
                raise StoreInputError(
                    f"--db {shown}: no result store at {path}; run `benchfarm run SPEC` (or "
                    "`benchfarm demo`) first, or pass --db / BENCHFARM_DB"
                )
            parent = path.parent
            if not parent.is_dir():
                raise StoreInputError(
                    f"--db {shown}: directory {parent} does not exist; create it or choose "
                    "another path"
                )
            watched = SqliteFile(path, shown)
    try:
        database = create_engine(parsed, **options)
    except (NoSuchModuleError, ImportError, ArgumentError, TypeError) as exc:
        raise StoreInputError(
            f"--db {shown}: cannot use this database driver ({exc}); install it or use "
            "sqlite:///PATH"
        ) from exc
    if is_sqlite:
        event.listen(database, "connect", _sqlite_connect)
        event.listen(database, "begin", _sqlite_begin)
    if watched is not None:
        event.listen(database, "connect", watched.on_connect)
        event.listen(database, "commit", watched.on_commit)
    event.listen(database, "handle_error", _database_failure(shown))
    return database


def _database_failure(shown: str) -> Callable[[ExceptionContext], None]:
    """A database that fails on a working connection (disk full, a corrupted file, an I/O
    error) is a failure while running: one line naming the store instead of a traceback. The
    failed statement's transaction is rolled back, so the store keeps only whole runs.

    Other failures while connecting (no server, a wrong password, a file that is no database
    at all) are left to ``Store.open``, which reports them as bad input."""

    def handle(context: ExceptionContext) -> None:
        original = context.original_exception
        damaged = getattr(original, "sqlite_errorname", "").startswith(SQLITE_DAMAGE)
        # constraint violations and bad statements are bugs: they keep their own exceptions
        failed = damaged or isinstance(context.sqlalchemy_exception,
                                       OperationalError | InternalError)
        if context.is_disconnect or not failed or (context.connection is None and not damaged):
            return
        reason = (str(original).splitlines() or [type(original).__name__])[0]
        raise StoreError(f"--db {shown}: the database failed ({reason}); the statement's "
                         "transaction was rolled back") from original

    return handle


class SchemaUnknown(Exception):
    """Alembic cannot upgrade the store's schema (its revision is not one of ours)."""


def head_revision() -> str | None:
    """The newest migration's revision id, read from the files (the one no other revises);
    None unless there is exactly one."""
    revisions, revised = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        source = path.read_text()
        revisions.update(re.findall(r'^revision = "([^"]+)"', source, re.MULTILINE))
        revised.update(re.findall(r'^down_revision = "([^"]+)"', source, re.MULTILINE))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def _is_current(database: Engine) -> bool:
    """Whether the store is at the newest revision already (the common case: then Alembic,
    a third of a second to import, is not needed)."""
    head = head_revision()
    with database.connect() as connection:
        if head is None or not inspect(connection).has_table("alembic_version"):
            return False
        return connection.scalar(text("SELECT version_num FROM alembic_version")) == head


def lost_database(shown: str) -> Callable[[ExceptionContext], None]:
    """For a store that opened: a server that stops or goes away mid-run (the connection drops,
    a new one is refused) is a failure while running, one line, not a chained traceback."""

    def handle(context: ExceptionContext) -> None:
        if not isinstance(context.sqlalchemy_exception, OperationalError | InterfaceError):
            return
        if not (context.is_disconnect or context.connection is None):
            return  # a statement failing on a working connection: _database_failure's
        original = context.original_exception
        reason = (str(original).strip().splitlines() or [type(original).__name__])[0]
        raise StoreError(f"--db {shown}: lost the database ({reason}); the runs stored so far "
                         "are kept, the one in flight is not") from original

    return handle


def migrate(database: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to ``revision`` with the Alembic migrations."""
    if revision == "head" and _is_current(database):
        return
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with database.connect() as connection:
        # Two processes opening a new SQLite file at once: IMMEDIATE takes the write lock before
        # reading the schema version, so the second waits and then finds the schema done,
        # instead of failing to upgrade its read lock ("database is locked").
        connection.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        _sqlite_foreign_keys(connection, False)
        try:
            with connection.begin():
                _restamp_renamed(connection)
                config.attributes["connection"] = connection
                try:
                    command.upgrade(config, revision)
                except CommandError as exc:
                    raise SchemaUnknown(str(exc)) from exc
        finally:
            _sqlite_foreign_keys(connection, True)


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """Foreign keys off while migrating, as SQLite's procedure for rebuilding a table asks
    (sqlite.org/lang_altertable.html): dropping a rebuilt parent table would otherwise cascade
    to its children. The pragma works outside a transaction only, so it goes to the driver's
    connection directly (a statement through SQLAlchemy would begin one)."""
    if connection.dialect.name == "sqlite":
        connection.connection.driver_connection.execute(
            f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _restamp_renamed(connection: Connection) -> None:
    """A store migrated before the renumbering holds an old revision id: give it the new one."""
    if not inspect(connection).has_table("alembic_version"):
        return
    for old, new in RENAMED_REVISIONS.items():
        connection.execute(text("UPDATE alembic_version SET version_num = :new "
                                "WHERE version_num = :old"), {"old": old, "new": new})


def writer(database: Engine) -> Engine:
    """``database`` for write transactions: on SQLite they open with BEGIN IMMEDIATE.

    A deferred transaction that reads and then writes cannot wait for another writer (SQLite
    answers "database is locked" at once, since waiting could deadlock); IMMEDIATE takes the
    write lock first, so it waits in the busy timeout instead. Other backends are unaffected.
    """
    return database.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})


def is_locked(exc: OperationalError) -> bool:
    return "database is locked" in str(exc.orig) or "database table is locked" in str(exc.orig)


def retry_locked(method: Callable[P, R]) -> Callable[P, R]:
    """Retry a whole write transaction that met SQLite's busy timeout, then fail with advice.

    Each call of ``method`` must be one transaction, so that a retry redoes all of it.
    """

    @functools.wraps(method)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        attempt = 0
        while True:
            try:
                return method(*args, **kwargs)
            except OperationalError as exc:
                if not is_locked(exc):
                    raise
                attempt += 1
                if attempt > LOCKED_RETRIES:
                    raise StoreError(
                        f"the SQLite result store stayed locked by another process for over "
                        f"{LOCKED_RETRIES * BUSY_TIMEOUT_S:.0f} s; check for a stuck benchfarm "
                        "process, or use PostgreSQL for many coordinators (README, team and "
                        "cluster)") from None
                time.sleep(random.uniform(0.05, 0.5) * attempt)

    return retrying
