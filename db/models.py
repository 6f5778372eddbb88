"""The tables of the result store (SQLAlchemy 2.0 typed ORM).

The schema is created and upgraded by the Alembic migrations in ``db/migrations``; a test checks
that the migrated schema matches these classes. Raw data is kept: every decode step of a
measurement (``decode_steps``, packed per measurement), the engine's JSON output verbatim in
``measurements.raw_json`` and every device fingerprint (both compressed, ``db.packing``); a run
(``runs``, the planned cell) has one ``measurements`` row per attempt, never overwritten.

What reads would otherwise derive from every row of a large store is kept as the rows land
(db.rows): each run's current measurement and its status (``runs.current_measurement_id``,
``runs.status``, ``runs.attempts``) and each experiment's runs per status
(``experiment_counts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.packing import CompressedJSON, CompressedText
from db.records import ALERT_STATES, RUN_STATUSES

# Explicit constraint names so that migrations can refer to them on every backend.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _one_of(column: str, values: Sequence[str]) -> CheckConstraint:
    """The check that ``column`` holds one of ``values``, made from the list the code checks
    against (the migrations keep the literal lists they wrote: they are history)."""
    quoted = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({quoted})", name=column)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime()}


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec_text: Mapped[str] = mapped_column(Text)  # the spec file as it was run
    spec_hash: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # how many times its runs' measurements were written (db.rows keeps it): what a cache of
    # what the experiment shows compares, instead of reading its runs
    writes: Mapped[int] = mapped_column(server_default="0")
    # the failures of its exact-attention baseline (reports.baseline's phrases joined by "; ",
    # "" when none) as they were when ``writes`` was ``baseline_writes``: `status` lists them
    # without reading runs while the two agree (NULL: not found out yet)
    baseline: Mapped[str | None] = mapped_column(Text)
    baseline_writes: Mapped[int | None]


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    arch: Mapped[str] = mapped_column(String(32))
    cls: Mapped[str] = mapped_column(String(100))  # device class, e.g. "rk3588"
    emulated: Mapped[bool] = mapped_column(Boolean)
    info: Mapped[dict[str, Any]]  # the inventory entry (host, port, cpus, exec_prefix ...)
    updated_at: Mapped[datetime]


class Build(Base):
    __tablename__ = "builds"
    __table_args__ = (UniqueConstraint("binary_sha256", "target"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    engine: Mapped[str] = mapped_column(String(32), server_default="lmc")  # harness.engines name
    target: Mapped[str] = mapped_column(String(32))
    # the instruction-set level it was built for (devices.isa); NULL for builds from before
    isa: Mapped[str | None] = mapped_column(String(32))
    variant: Mapped[str] = mapped_column(String(32))
    toolchain: Mapped[str] = mapped_column(String(32))
    compiler: Mapped[str] = mapped_column(String(200))
    compiler_version: Mapped[str] = mapped_column(String(500))
    cflags: Mapped[list[Any]]
    ldflags: Mapped[list[Any]]
    source_hash: Mapped[str] = mapped_column(String(128))
    revision: Mapped[str] = mapped_column(String(128))
    build_key: Mapped[str | None] = mapped_column(String(128))
    binary: Mapped[str] = mapped_column(Text)  # path of the binary on the coordinator
    binary_sha256: Mapped[str] = mapped_column(String(64))
    build_seconds: Mapped[float | None] = mapped_column(Float)
    extra: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("path", "sha256"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))  # harness.identity.weights_sha256
    config: Mapped[dict[str, Any]]  # config.json


class Workload(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # needle, ppl, decode, attn-bench
    params: Mapped[dict[str, Any]]  # the axes that made it (ctx, depth, seed ...)
    content_hash: Mapped[str] = mapped_column(String(128), unique=True)
    ids: Mapped[list[Any]]  # the prompt / text token ids
    answer: Mapped[str | None] = mapped_column(Text)
    needle_span: Mapped[list[Any] | None]  # [start, end) of the needle in ids


class Run(Base):
    """A planned cell of the matrix, named by its run key: what is measured, not a measurement
    (nor the board: a pooled run may be measured on any board of its class).

    Each attempt at it is a row of ``measurements`` (append-only): a retry, a resume and a
    ``--force`` rerun each add one and never change an earlier one.
    """

    __tablename__ = "runs"
    __table_args__ = (Index(None, "experiment_id"), Index(None, "build_id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    run_key: Mapped[str] = mapped_column(String(128), unique=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))
    workload_id: Mapped[int | None] = mapped_column(ForeignKey("workloads.id"))
    engine: Mapped[str] = mapped_column(String(32), server_default="lmc")  # harness.engines name
    command: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]]
    policy: Mapped[str | None] = mapped_column(String(32))
    k: Mapped[int | None]
    block: Mapped[int | None]
    probes: Mapped[int | None]
    kv: Mapped[str | None] = mapped_column(String(16))
    wq: Mapped[str | None] = mapped_column(String(16))
    threads: Mapped[int | None]
    prefill_attn: Mapped[str | None] = mapped_column(String(32))
    repeat: Mapped[int]
    # kept by the store as measurements land (db.rows.refresh_runs): the measurement reads use
    # (its latest ok one made under a live lease, else its latest), its status, and how many
    # attempts the run has; NULL / 0 before its first measurement
    current_measurement_id: Mapped[int | None] = mapped_column(index=True)
    status: Mapped[str | None] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(server_default="0")


# The columns of ``runs`` the store keeps from the run's measurements (db.rows.refresh_runs).
RUN_KEPT = ("current_measurement_id", "status", "attempts")


class ExperimentRun(Base):
    """Which experiments a run belongs to.

    Run keys do not name the experiment, so two specs that contain the same run share one row:
    the second finds it done. This link makes the run part of both experiments' results;
    ``runs.experiment_id`` is the experiment whose run produced the row.
    """

    __tablename__ = "experiment_runs"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class ExperimentCount(Base):
    """How many of an experiment's runs are in each status now (their current measurement's),
    kept by the store as measurements land, so that `status` reads a few rows per experiment
    instead of every run. One row per experiment and status, made with the experiment."""

    __tablename__ = "experiment_counts"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    runs: Mapped[int]


class StepResult(Base):
    """The steps found in one series of a history (``reports.history``), kept by what they
    were found in: ``key`` is the sha256 of the detector's version, its parameters and the
    series' values. A series that gains a point has a new key; one that did not is found here
    instead of being fitted again on every report and page."""

    __tablename__ = "step_results"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    steps: Mapped[list[Any]]  # [[index, before, after], ...]
    computed_at: Mapped[datetime]


class DeviceSnapshot(Base):
    __tablename__ = "device_snapshots"

    id: Mapped[int] = mapped_column(primary_key=True)
    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("measurements.id", ondelete="CASCADE"), index=True)
    phase: Mapped[str] = mapped_column(String(16))  # before | after
    taken_at: Mapped[datetime | None]
    fingerprint: Mapped[dict[str, Any]] = mapped_column(CompressedJSON)
    # db.rows.snapshot_summary: the part reports read of every snapshot (flags,
    # CPU, load), so that a report of 100,000 runs does not decompress 200,000 documents;
    # written with every snapshot (nullable only so that migration 0016 adds it in place)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class DecodeSteps(Base):
    """Every decode step of a measurement, packed into one row (``db.packing``: the tokens as
    32-bit integers, the times as 64-bit floats, in step order): a year of runs would otherwise
    be tens of millions of rows of 40 bytes of overhead each."""

    __tablename__ = "decode_steps"

    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("measurements.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    steps: Mapped[int]
    tokens: Mapped[bytes] = mapped_column(LargeBinary)
    ms: Mapped[bytes] = mapped_column(LargeBinary)
    attn_ms: Mapped[bytes | None] = mapped_column(LargeBinary)  # NULL when no step has one


class OutcomeRow(Base):
    __tablename__ = "outcomes"

    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("measurements.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    generated_ids: Mapped[list[Any] | None]
    text: Mapped[str | None] = mapped_column(Text)
    expected_answer: Mapped[str | None] = mapped_column(Text)
    recall: Mapped[float | None] = mapped_column(Float)
    nll: Mapped[float | None] = mapped_column(Float)
    ppl: Mapped[float | None] = mapped_column(Float)
    selection_mass: Mapped[float | None] = mapped_column(Float)
    oracle_recall: Mapped[float | None] = mapped_column(Float)
    max_abs_diff: Mapped[float | None] = mapped_column(Float)
    bytes_read: Mapped[int | None] = mapped_column(BigInteger)
    attn_median_ms: Mapped[float | None] = mapped_column(Float)
    extra: Mapped[dict[str, Any]]
    peak_rss_kb: Mapped[int | None] = mapped_column(BigInteger)
    kv_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_resident_bytes: Mapped[int | None] = mapped_column(BigInteger)


class Lease(Base):
    """Who may use a board now: one row per board, taken atomically before each run.

    A lease is free when its row is missing or ``expires`` has passed; its holder renews it
    (heartbeat) while the run is in flight, so a dead holder's lease lapses by itself.
    """

    __tablename__ = "leases"

    board: Mapped[str] = mapped_column(String(200), primary_key=True)
    lease_id: Mapped[str] = mapped_column(String(36), unique=True)  # new for every acquisition
    holder: Mapped[str] = mapped_column(String(200))  # host:pid:nonce of the coordinator
    experiment: Mapped[str | None] = mapped_column(String(200))
    run_key: Mapped[str | None] = mapped_column(String(128))  # None during a warm-up
    acquired: Mapped[datetime]
    heartbeat: Mapped[datetime]
    expires: Mapped[datetime]


JOB_STATES = ("queued", "running", "done", "failed", "cancelled")


class Job(Base):
    """One experiment for a coordinator: queued by `submit`, or run at once by `run`."""

    __tablename__ = "jobs"
    __table_args__ = (
        _one_of("state", JOB_STATES),
        Index(None, "state", "priority"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment: Mapped[str] = mapped_column(String(200), index=True)
    spec_path: Mapped[str] = mapped_column(Text)  # where the spec was read (relative paths)
    spec_text: Mapped[str] = mapped_column(Text)  # the spec as submitted
    devices: Mapped[list[Any] | None]  # --devices selectors, None for the spec's own
    force: Mapped[bool] = mapped_column(Boolean)
    kind: Mapped[str] = mapped_column(String(8))  # "queue" (submitted) or "run" (one-shot)
    priority: Mapped[int]
    owner: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    holder: Mapped[str | None] = mapped_column(String(200))  # the coordinator running it
    heartbeat: Mapped[datetime | None]
    totals: Mapped[dict[str, Any] | None]  # placement (board or class) -> runs in the matrix
    message: Mapped[str | None] = mapped_column(Text)  # the outcome line or the error
    submitted_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    notify: Mapped[dict[str, Any] | None]  # where the job's end is announced (url, command)
    cancelled_by: Mapped[str | None] = mapped_column(String(200))  # who cancelled it


# What happens to a job, in the order it may happen (db.jobs writes each with its cause).
JOB_EVENTS = ("submitted", "claimed", "taken over", "waiting", "drained", "requeued",
              "interrupted", "cancelled", "finished", "lost")


class JobEvent(Base):
    """One transition of a job: when (UTC), what, who caused it (a user, a coordinator) and
    why. A job's story, in id order, is its events; its runs' attempts are its measurements."""

    __tablename__ = "job_events"
    __table_args__ = (_one_of("event", JOB_EVENTS),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    event: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str | None] = mapped_column(String(200))
    cause: Mapped[str | None] = mapped_column(Text)


BOARD_STATES = ("online", "maintenance", "retired", "bad")


class BoardState(Base):
    """A board's state now (no row: online), and its consecutive infrastructure failures."""

    __tablename__ = "board_states"
    __table_args__ = (
        _one_of("state", BOARD_STATES),
    )

    board: Mapped[str] = mapped_column(String(200), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    since: Mapped[datetime]
    changed_by: Mapped[str] = mapped_column(String(200))
    failures: Mapped[int]  # runs lost in a row (reset by a run that reached the engine)


class BoardEvent(Base):
    """Every change of a board's state: who, when and why."""

    __tablename__ = "board_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    board: Mapped[str] = mapped_column(String(200), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    changed_by: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime]


class HealthCheck(Base):
    """One health check of a board (`devices check`, or one `serve` scheduled)."""

    __tablename__ = "health_checks"

    id: Mapped[int] = mapped_column(primary_key=True)
    board: Mapped[str] = mapped_column(String(200), index=True)
    ok: Mapped[bool] = mapped_column(Boolean)
    items: Mapped[list[Any]]  # [{"name", "ok", "detail"}...]
    checked_by: Mapped[str] = mapped_column(String(200))
    checked_at: Mapped[datetime]


class Reservation(Base):
    """A board kept for one owner's work until ``ends`` (or until released)."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(primary_key=True)
    board: Mapped[str] = mapped_column(String(200), index=True)
    owner: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)
    starts: Mapped[datetime]
    ends: Mapped[datetime]
    released_at: Mapped[datetime | None]
    released_by: Mapped[str | None] = mapped_column(String(200))


class Measurement(Base):
    """One attempt at a run: its status, timings and raw output (child rows: its decode steps,
    outcome and device snapshots). Rows are added, and only the attempt itself completes its
    own row (``running`` → its result); see db/README.md for the statuses."""

    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint("run_id", "attempt"),
        Index(None, "status"),  # the sweep for lost attempts looks for running ones
        # a board's latest attempt (the dashboard's boards): its newest id read off the index
        Index(None, "device_id", "id"),
        # the attempts of the dashboard's 24-hour timelines (finished since, or not finished)
        Index(None, "finished_at"),
        _one_of("status", RUN_STATUSES),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int]  # 1, 2, ... in the order the attempts started
    # the board it ran on (a pooled run's attempts may run on different boards of its class)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    status: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    wall_ms: Mapped[float | None] = mapped_column(Float)
    engine_ms: Mapped[float | None] = mapped_column(Float)
    overhead_ms: Mapped[float | None] = mapped_column(Float)
    prefill_ms: Mapped[float | None] = mapped_column(Float)
    decode_ms_per_token: Mapped[float | None] = mapped_column(Float)
    attn_ms_per_token: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None]
    raw_json: Mapped[str | None] = mapped_column(CompressedText)  # the engine's stdout
    lease_id: Mapped[str | None] = mapped_column(String(36))  # the board lease it ran under
    # the job whose coordinator made the attempt (None: stored before jobs named their runs, or
    # a bulk import); `benchfarm logs JOB` lists a job's attempts by it
    job_id: Mapped[int | None] = mapped_column(index=True)
    # its lease had expired (or passed to another coordinator) when its result was stored: kept,
    # never counted as the run's ok
    lease_expired: Mapped[bool] = mapped_column(Boolean, server_default=false())


class BoardWaiter(Base):
    """A coordinator waiting for a board: the next lease goes to the best fresh waiter (highest
    priority, then the longest waiting; see db.leases)."""

    __tablename__ = "board_waiters"

    board: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200), primary_key=True)
    priority: Mapped[int]  # its job's
    since: Mapped[datetime]  # waiting since
    seen: Mapped[datetime]  # last asked: a waiter that stopped asking has gone


class User(Base):
    """A person (or service) of a shared farm: the SHA-256 of their token, never the token.

    While the table is empty the local OS user is the admin (a single-user setup needs no
    set-up); from the first row on, every command that acts presents a user's token. A revoked
    user keeps the row (the name stays theirs in what was recorded) and no token resolves."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str | None] = mapped_column(String(200))


class AuditRecord(Base):
    """Who did what and when: one row per action a person took on the farm (db.audit)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(200), index=True)  # who did it
    # True: a user's token said so; False: a store without users, the local OS user's name
    checked: Mapped[bool] = mapped_column(Boolean)
    action: Mapped[str] = mapped_column(String(32))  # submit, cancel, reserve, ...
    target: Mapped[str] = mapped_column(String(200))  # "job 3", "board rk-1", "user ann"
    acting_for: Mapped[str | None] = mapped_column(String(200))  # the owner acted for, if not
    # the actor: an admin on someone else's job or reservation
    detail: Mapped[str | None] = mapped_column(Text)


class BuildRevision(Base):
    """A revision name a build was registered under: revisions with the same engine sources
    build one binary (one ``builds`` row), and each of them finds its runs."""

    __tablename__ = "build_revisions"
    __table_args__ = (UniqueConstraint("build_id", "revision"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    revision: Mapped[str] = mapped_column(String(128), index=True)


class Alert(Base):
    """The steps of an experiment's history at one culprit commit (db.alerts), and where a
    person's triage left them."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("experiment", "revision"), _one_of("state", ALERT_STATES))

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment: Mapped[str] = mapped_column(String(200))
    revision: Mapped[str] = mapped_column(String(128))  # the culprit commit
    previous: Mapped[str | None] = mapped_column(String(128))  # the revision measured before
    subject: Mapped[str] = mapped_column(String(500))
    authored_at: Mapped[str | None] = mapped_column(String(40))  # the commit's author date
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class AlertStep(Base):
    """One series that moved at the alert's commit."""

    __tablename__ = "alert_steps"
    __table_args__ = (UniqueConstraint("alert_id", "device", "config", "metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id"))
    device: Mapped[str] = mapped_column(String(200))
    config: Mapped[str] = mapped_column(String(500))
    metric: Mapped[str] = mapped_column(String(64))
    before: Mapped[float] = mapped_column(Float)
    after: Mapped[float] = mapped_column(Float)
    ratio: Mapped[float | None] = mapped_column(Float)
    regression: Mapped[bool] = mapped_column(Boolean)
    back_at: Mapped[str | None] = mapped_column(String(128))  # a later step back to `before`


class AlertChange(Base):
    """Who moved an alert to which state, when, and why."""

    __tablename__ = "alert_changes"

    id: Mapped[int] = mapped_column(primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id"), index=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(200))
    checked: Mapped[bool] = mapped_column(Boolean)  # a user's token said so
    state_from: Mapped[str | None] = mapped_column(String(16))
    state_to: Mapped[str] = mapped_column(String(16))
    note: Mapped[str | None] = mapped_column(Text)
