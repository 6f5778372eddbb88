"""Fixtures for the db area: a fresh SQLite store per test and complete sample runs."""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, MetaData, Table, create_engine, text

from db import Outcome, RunResult, Snapshot, Store, TokenTiming
from db.models import Build, Experiment

# PostgreSQL runs are opt-in: BENCHFARM_TEST_POSTGRES=1 (needs Debian's postgresql and psycopg).
POSTGRES_OPT_IN = "BENCHFARM_TEST_POSTGRES"


@dataclass
class StoreRefs:
    """Ids of one experiment's reference rows, as the coordinator would hold them."""

    experiment_id: int
    device_id: int
    build_id: int
    model_id: int
    workload_id: int


BUILD_RECORD = {
    "target": "x86_64", "variant": "release", "toolchain": "gcc", "compiler": "gcc",
    "compiler_version": "gcc (Debian 12.2.0-14) 12.2.0", "cflags": ["-O3", "-march=x86-64-v3"],
    "ldflags": ["-lm", "-lpthread"], "source_hash": "a" * 64, "revision": "working-tree",
    "build_key": "b" * 16, "binary": "/tmp/lmc", "binary_sha256": "c" * 64,
    "build_seconds": 1.5, "rebuilt": True, "extra": {},
}


def add_refs(store: Store, experiment: str = "exp", device: str = "local") -> StoreRefs:
    return StoreRefs(
        experiment_id=store.upsert_experiment(experiment, f"name = '{experiment}'\n", "h1"),
        device_id=store.upsert_device(device, "x86_64", "x86", False, {"host": "127.0.1.1"}),
        build_id=store.record_build(BUILD_RECORD),
        model_id=store.upsert_model("models/tiny", "d" * 64, {"hidden_size": 64}),
        workload_id=store.upsert_workload("needle", {"ctx": 256, "depth": 0.5, "seed": 1},
                                          "w" * 16, [1, 2, 3, 4], answer="ramen",
                                          needle_span=[1, 3]),
    )


def refs_before_engines(old: Store) -> StoreRefs:
    """Reference rows in a schema older than 0005, whose builds have no engine column (the ORM
    class has it, so the build goes in through the table's old columns)."""
    build = {k: v for k, v in BUILD_RECORD.items() if k in Build.__table__.columns
             and k != "engine"}
    with old.database.begin() as conn:
        build_id = conn.execute(Build.__table__.insert().values(
            **build, created_at=datetime(2025, 3, 1))).inserted_primary_key[0]
        # the experiment through its table: an old schema has no counts per status to start
        experiment_id = conn.execute(Experiment.__table__.insert().values(
            name="exp", spec_text="name = 'exp'\n", spec_hash="h1",
            created_at=datetime(2025, 3, 1), updated_at=datetime(2025, 3, 1))
        ).inserted_primary_key[0]
    return StoreRefs(experiment_id,
                     old.upsert_device("local", "x86_64", "x86", False, {}), build_id,
                     old.upsert_model("models/tiny", "d" * 64, {}),
                     old.upsert_workload("decode", {"ctx": 8, "seed": 0}, "w" * 16, [1, 2]))


def insert_old_run(database: Engine, refs: StoreRefs, key: str, **overrides: object) -> int:
    """A run as a schema before 0005 holds it (one ``runs`` row with whichever columns its
    revision has, and its children keyed by ``run_id``); returns the row id."""
    result = sample_result(refs, key, **overrides)
    values = {k: v for k, v in vars(result).items() if k not in ("outcome", "snapshots")}
    values["attempts"] = 1
    with database.begin() as conn:
        tables = {name: Table(name, MetaData(), autoload_with=conn)
                  for name in ("runs", "token_timings", "outcomes", "device_snapshots")}
        runs = tables["runs"]
        run_id = conn.execute(runs.insert().values(
            **{c.name: values[c.name] for c in runs.columns if c.name != "id"})
        ).inserted_primary_key[0]
        if result.token_timings:
            conn.execute(tables["token_timings"].insert(),
                         [{"run_id": run_id, **vars(t)} for t in result.token_timings])
        if result.outcome is not None:
            outcomes = tables["outcomes"]
            conn.execute(outcomes.insert().values(run_id=run_id, **{
                k: v for k, v in vars(result.outcome).items() if k in outcomes.columns}))
        for snap in result.snapshots:
            conn.execute(tables["device_snapshots"].insert().values(run_id=run_id, **vars(snap)))
    return run_id


def insert_measured_run(engine: Engine, refs: StoreRefs, key: str,
                        results: list[RunResult] | None = None, **overrides: object) -> int:
    """A run as the schemas 0005 to 0008 hold it (a ``runs`` row, one ``measurements`` row per
    result, a ``token_timings`` row per decode step, the fingerprints and raw output as plain
    JSON and text), written through the tables as they are; returns the run's id."""
    results = results or [sample_result(refs, key, **overrides)]
    with engine.begin() as conn:
        tables = {name: Table(name, MetaData(), autoload_with=conn)
                  for name in ("runs", "measurements", "token_timings", "outcomes",
                               "device_snapshots", "experiment_runs")}
        runs, measurements = tables["runs"], tables["measurements"]
        first = vars(results[0])
        run_id = conn.execute(runs.insert().values(
            **{c.name: first[c.name] for c in runs.columns if c.name != "id"})
        ).inserted_primary_key[0]
        conn.execute(tables["experiment_runs"].insert().values(
            experiment_id=refs.experiment_id, run_id=run_id))
        for attempt, result in enumerate(results, start=1):
            values = vars(result)
            measurement_id = conn.execute(measurements.insert().values(
                run_id=run_id, attempt=attempt, lease_expired=False,
                **{c.name: values[c.name] for c in measurements.columns
                   if c.name in values and c.name not in ("id", "run_id")})
            ).inserted_primary_key[0]
            if result.token_timings:
                conn.execute(tables["token_timings"].insert(),
                             [{"measurement_id": measurement_id, **vars(t)}
                              for t in result.token_timings])
            if result.outcome is not None:
                outcomes = tables["outcomes"]
                conn.execute(outcomes.insert().values(measurement_id=measurement_id, **{
                    k: v for k, v in vars(result.outcome).items() if k in outcomes.columns}))
            for snap in result.snapshots:
                conn.execute(tables["device_snapshots"].insert().values(
                    measurement_id=measurement_id, **vars(snap)))
    return run_id


def sample_result(refs: StoreRefs, key: str, status: str = "ok", steps: int = 4,
                  **overrides: object) -> RunResult:
    """A generate run with every field filled (``steps`` decode steps)."""
    start = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    values: dict[str, object] = dict(
        run_key=key, experiment_id=refs.experiment_id, device_id=refs.device_id,
        build_id=refs.build_id, model_id=refs.model_id, workload_id=refs.workload_id,
        command="generate", status=status, config={"attn": "sparse", "k": 4, "threads": 2},
        policy="sparse", k=4, block=32, probes=8, kv="f32", wq="f32", threads=2,
        prefill_attn="exact", repeat=0, exit_code=0 if status == "ok" else 1,
        error=None if status == "ok" else "lmc: error: boom", started_at=start,
        finished_at=start + timedelta(seconds=2), wall_ms=2000.0, engine_ms=1900.0,
        overhead_ms=100.0, prefill_ms=300.0, decode_ms_per_token=12.5, attn_ms_per_token=3.0,
        prompt_tokens=4, raw_json='{"schema": 1}',
        token_timings=[TokenTiming(step=i, token=100 + i, ms=12.0 + i, attn_ms=3.0)
                       for i in range(steps)],
        outcome=Outcome(generated_ids=[100 + i for i in range(steps)], text="ramen",
                        expected_answer="ramen", recall=1.0, selection_mass=0.9,
                        oracle_recall=0.75, max_abs_diff=1e-6, bytes_read=3 * 2**31,
                        extra={"note": "x"}, peak_rss_kb=812_000,
                        kv_allocated_bytes=5 * 2**32, kv_resident_bytes=3 * 2**28),
        snapshots=[Snapshot("before", {"governor": "performance", "temp_c": 40.0}, start),
                   Snapshot("after", {"governor": "performance", "temp_c": 45.0}, start)],
    )
    values.update(overrides)
    return RunResult(**values)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PostgresCluster:
    """A throw-away cluster: the URL of its maintenance database, and how to stop and start it
    (a test of a server that goes away mid-run)."""

    url: str
    pg_ctl: list[str]
    port: int
    data: Path

    def stop(self) -> None:
        subprocess.run([*self.pg_ctl, "-m", "immediate", "stop"], capture_output=True)

    def start(self) -> None:
        subprocess.run([*self.pg_ctl, "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}",
                        "-l", str(self.data / "log"), "-w", "start"], check=True,
                       capture_output=True)


@contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster on 127.0.0.1 (as the postgres user when run as root), deleted after."""
    if os.environ.get(POSTGRES_OPT_IN) != "1":
        pytest.skip(f"PostgreSQL tests are opt-in: set {POSTGRES_OPT_IN}=1")
    pytest.importorskip("psycopg")
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not versions:
        pytest.skip("Debian's postgresql is not installed (apt-get install postgresql)")
    bin_dir = versions[-1].parent
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="benchfarm-pg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root
        account = pwd.getpwnam("postgres")
        os.chown(data, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    pg_ctl = [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data / "cluster")]
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data / "cluster"), "-A", "trust",
                    "-U", "postgres", "--no-sync"], check=True, capture_output=True)
    cluster = PostgresCluster(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
                              pg_ctl, port, data)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The session's throw-away PostgreSQL cluster: the URL of its maintenance database."""
    with postgres_cluster() as cluster:
        yield cluster.url


_database_numbers = itertools.count()


def fresh_postgres_database(server_url: str) -> str:
    name = f"store_{os.getpid()}_{next(_database_numbers)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A fresh, empty database: a SQLite file, and a PostgreSQL database when opted in."""
    if request.param == "sqlite":
        return sqlite_url
    return fresh_postgres_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store.open(store_url)
    yield opened
    opened.close()


@pytest.fixture
def refs(store: Store) -> StoreRefs:
    return add_refs(store)
