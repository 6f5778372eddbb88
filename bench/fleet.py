"""A fleet of boards: what the coordinator does with 16, 32 and 64 boards at once.

The real path (``run_experiment``: planning, one DeviceRunner actor per board on a private Ray
instance, the scheduler, board leases, the store) drives N boards on this machine
(``transport = "local"``, a workdir each) whose engine is ``bench/standin.sh``: it sleeps
``--run-s`` seconds and prints a valid ``lmc/1`` document, so that the harness and not the
engine is measured. The spec pins ``--runs-per-board`` runs to every board (no warm-ups). Each
size runs ``--repeats`` times on each store: a fresh SQLite file, and a fresh database of a
throw-away PostgreSQL cluster (``scripts/postgres.sh``, stopped and removed at the end;
``--stores sqlite`` leaves it out).

Per size and store, medians over the repeats of:

* idle med / max: each board's share of its span (its first run's start to its last run's end,
  as its runner stamped them) spent between runs; the median board and the worst;
* stand-in: each board's share of its span that the stand-in ran (the stored engine time);
  the rest of the busy time is the runner's own work per run (localise, lock file,
  fingerprints, checking the document);
* CPU/run, loop/run: the driver process's CPU (user + sys, all its threads) over the whole
  ``run_experiment`` (planning, starting the runners, the loop) and over the scheduler's loop
  alone (from every runner placed to their retirement), per run;
* runners, boards, ray: CPU per run over the loop of the runner actors themselves, of the
  commands they ran (lock script, fingerprints, the stand-in: a real board's own CPU), and of
  the rest of Ray (raylet, GCS, idle workers); busy: the machine's busy share over the loop;
  others: the cores other work on the machine took meanwhile (from /proc/stat);
* tx/s, stmt/s: the store's write transactions and write statements per second of the loop;
* hand-over: from the moment the driver stored a board's result (``save_run`` returned) to
  the start of that board's next run (lease hand-over, the attempt's ``running`` row,
  dispatch, the actor taking it), median / p95 over every hand-over;
* result: from a run's end on its board to its result stored (Ray's return, the driver's
  turn, ``save_run``), median / p95;
* ramp: the first board's first run to the last board's first run; start: ``run_experiment``
  called to every runner placed (planning, Ray starting one worker process per board).

The load (``uptime``) is printed with every figure: on a shared machine it says how much of the
CPU the fleet had.

``--store-cycle RUNS`` times instead the driver's store work per run alone (no Ray, no boards):
the take of a board's lease with its done check and attempt, and the result stored, for RUNS
runs on each of 16 boards in turn, with the statements and commits it sends.

    .venv/bin/python bench/fleet.py [--boards 16,32,64] [--run-s 1] [--runs-per-board 20]
        [--repeats 3] [--stores sqlite,postgres] [--profile FILE] [--store-cycle RUNS]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, event, text  # noqa: E402

from db import records  # noqa: E402
from db.records import Outcome, RunResult, TokenTiming  # noqa: E402
from db.store import Store  # noqa: E402
from devices.connect import connect  # noqa: E402
from devices.fingerprint import probe  # noqa: E402
from devices.inventory import device_table, load_inventory, local_device  # noqa: E402
from harness.execution import scheduler as scheduler_module  # noqa: E402
from harness.execution.cluster import ray_session  # noqa: E402
from harness.execution.coordinator import RunRequest, run_experiment  # noqa: E402
from harness.execution.leases import BoardTurns, Sharing  # noqa: E402
from harness.execution.progress import Progress  # noqa: E402
from harness.spec import load_spec  # noqa: E402

MODEL = REPO / "models" / "needle-tiny"
STANDIN = REPO / "bench" / "standin.sh"
SPEC = """name = "{name}"
model = "{model}"
devices = {devices}
repeats = {repeats}
warmups = 0
timeout_s = {timeout}

[engine.policy.exact]

[[workload]]
kind = "needle"
ctx = 128
depth = 0.5
seed = 0
max_new = 2
"""
WRITES = ("INSERT", "UPDATE", "DELETE")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Snapshot:
    """The machine's CPU and that of the driver's process tree at one moment (Linux /proc)."""

    at: float
    busy_s: float  # the whole machine's busy CPU seconds (all cores)
    idle_s: float
    # the driver and its descendants: pid -> (group, its own CPU s, its waited-for children's)
    procs: dict[int, tuple[str, float, float]]

    @classmethod
    def take(cls) -> Snapshot:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7)) / TICK  # user nice system irq ...
        idle = (fields[3] + fields[4]) / TICK
        parents: dict[int, int] = {}
        cpu: dict[int, tuple[float, float]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(entry.name)
            parents[pid] = int(rest[1])
            # utime stime cutime cstime: a process's own CPU and that of its waited-for children
            cpu[pid] = (sum(int(v) for v in rest[11:13]) / TICK,
                        sum(int(v) for v in rest[13:15]) / TICK)
        me = os.getpid()
        procs = {}
        for pid in cpu:
            chain, up = [], pid
            while up not in (0, 1, me) and up in parents and len(chain) < 64:
                chain.append(up)
                up = parents[up]
            if up != me and pid != me:
                continue
            procs[pid] = (_group(pid, me), *cpu[pid])
        return cls(time.time(), busy, idle, procs)


def _group(pid: int, me: int) -> str:
    if pid == me:
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return "ray"
    return "runners" if b"DeviceRunner" in cmdline else "ray"


def cpu_between(first: Snapshot, last: Snapshot) -> dict[str, float]:
    """CPU seconds between two snapshots: the driver, the runner actors, the commands they ran
    on their boards (the lock script, fingerprints, the stand-in: on real boards, the boards'
    CPU), the rest of Ray (raylet, GCS, idle workers), the machine, and what others on the
    machine used."""
    groups = {"driver": 0.0, "runners": 0.0, "boards": 0.0, "ray": 0.0}
    for pid, (group, own, children) in last.procs.items():
        _, own_before, children_before = first.procs.get(pid, (group, 0.0, 0.0))
        groups[group] += max(0.0, own - own_before)
        groups["boards" if group == "runners" else group] += max(0.0, children
                                                                 - children_before)
    groups["machine"] = last.busy_s - first.busy_s
    groups["others"] = max(0.0, groups["machine"] - groups["driver"] - groups["runners"]
                           - groups["boards"] - groups["ray"])
    groups["capacity"] = groups["machine"] + last.idle_s - first.idle_s
    return groups


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def write_inventory(folder: Path, boards: int, run_s: float) -> Path:
    """N boards on this machine, each with a workdir of its own, running the stand-in."""
    path = folder / f"fleet-{boards}.toml"
    path.write_text("".join(device_table({
        "name": f"fleet-{i:02d}", "transport": "local", "class": "fleet",
        "workdir": str(folder / "boards" / f"fleet-{i:02d}"),
        "exec_prefix": ["sh", str(STANDIN), f"{run_s:g}"]}) for i in range(boards)))
    return path


def write_spec(folder: Path, name: str, boards: int, runs: int, run_s: float) -> Path:
    path = folder / f"{name}.toml"
    devices = "[" + ", ".join(f'"fleet-{i:02d}"' for i in range(boards)) + "]"
    path.write_text(SPEC.format(name=name, model=MODEL, devices=devices, repeats=runs,
                                timeout=max(60, 30 * run_s)))
    return path


@dataclass
class Counted:
    """What the driver did to the store, counted by SQLAlchemy events on its engine."""

    statements: list[float] = field(default_factory=list)  # when each write statement ran
    transactions: list[float] = field(default_factory=list)  # when each write committed
    stored_at: dict[str, float] = field(default_factory=dict)  # run key -> save_run returned


@contextmanager
def counting(store: Store) -> Any:
    counted = Counted()

    def statement(conn: Any, cursor: Any, sql: str, params: Any, context: Any,
                  many: bool) -> None:
        if sql.lstrip()[:6].upper() in WRITES:
            moment = time.time()
            counted.statements += [moment] * (len(params) if many and params else 1)
            conn.info["benchfarm_wrote"] = True

    def commit(conn: Any) -> None:
        if conn.info.pop("benchfarm_wrote", False):
            counted.transactions.append(time.time())

    event.listen(store.database, "before_cursor_execute", statement)
    event.listen(store.database, "commit", commit)
    save_run = store.save_run

    def timed_save(result: Any, measurement_id: int | None = None) -> Any:
        saved = save_run(result, measurement_id)
        if result.status == "ok":
            counted.stored_at[result.run_key] = time.time()
        return saved

    store.save_run = timed_save  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        del store.save_run
        event.remove(store.database, "before_cursor_execute", statement)
        event.remove(store.database, "commit", commit)


@dataclass
class Loop:
    """The scheduler's loop once every runner is placed, until it retires them: snapshots at
    both ends (and the loop profiled with ``profile``)."""

    first: Snapshot | None = None
    last: Snapshot | None = None
    profile: cProfile.Profile | None = None


@contextmanager
def timing_loop(profile: bool) -> Any:
    """Snapshots around the scheduler's loop, taken where it calls ``wait_placed`` and
    ``retire`` (the bench's own wrappers of the scheduler module's names)."""
    loop = Loop(profile=cProfile.Profile() if profile else None)
    wait_placed, retire = scheduler_module.wait_placed, scheduler_module.retire

    def placed(*args: Any) -> None:
        wait_placed(*args)
        loop.first = Snapshot.take()
        if loop.profile:
            loop.profile.enable()

    def retiring(actors: Any) -> None:
        if loop.profile:
            loop.profile.disable()
        loop.last = Snapshot.take()
        retire(actors)

    scheduler_module.wait_placed, scheduler_module.retire = placed, retiring
    try:
        yield loop
    finally:
        scheduler_module.wait_placed, scheduler_module.retire = wait_placed, retire


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Figures:
    idle_median: float
    idle_max: float
    standin_median: float
    cpu_total: float  # the driver's, per run, over run_experiment
    cpu_loop: float  # the driver's, per run, over the loop
    cpu_runners: float  # the runner actors' own, per run, over the loop
    cpu_boards: float  # the commands the runners ran (on real boards: the boards'), per run
    cpu_ray: float  # per run, over the loop
    busy: float  # the machine's busy share over the loop
    others: float  # cores others used meanwhile
    writes_tx: float  # per second of the loop
    writes_stmt: float
    handover_median: float
    handover_p95: float
    result_median: float
    result_p95: float
    ramp_s: float  # the first run's start to the last board's first start
    start_s: float  # run_experiment called to every runner placed (planning, actors' start)
    runs: int


def measure(store: Store, experiment: str, boards: int, runs_per_board: int,
            counted: Counted, loop: Loop, cpu_total: float, called: float) -> Figures:
    runs = store.frames(experiment)["runs"]
    expected = boards * runs_per_board
    ok = runs[runs["status"] == "ok"]
    if len(ok) != expected or ok["run_key"].nunique() != expected:
        raise SystemExit(f"fleet: {experiment}: {len(ok)} runs stored ok of {expected}: "
                         f"{runs['status'].value_counts().to_dict()}")
    idle, standin, handover, result = [], [], [], []
    starts = []
    for _, board in ok.groupby("device_name"):
        board = board.sort_values("started_at")
        begin = board["started_at"].iloc[0].timestamp()
        starts.append(begin)
        span = board["finished_at"].iloc[-1].timestamp() - begin
        ends = [t.timestamp() for t in board["finished_at"]]
        begins = [t.timestamp() for t in board["started_at"]]
        keys = list(board["run_key"])
        gaps = [b - e for e, b in zip(ends[:-1], begins[1:], strict=True)]
        idle.append(sum(gaps) / span)
        standin.append(board["engine_ms"].sum() / 1000.0 / span)
        for key, end in zip(keys, ends, strict=True):
            result.append(counted.stored_at[key] - end)
        for key, begin_next in zip(keys[:-1], begins[1:], strict=True):
            handover.append(begin_next - counted.stored_at[key])
    assert loop.first is not None and loop.last is not None
    cpu = cpu_between(loop.first, loop.last)
    wall = loop.last.at - loop.first.at

    def per_s(moments: list[float]) -> float:
        return sum(loop.first.at <= m <= loop.last.at for m in moments) / wall

    return Figures(
        idle_median=statistics.median(idle), idle_max=max(idle),
        standin_median=statistics.median(standin),
        cpu_total=cpu_total / expected, cpu_loop=cpu["driver"] / expected,
        cpu_runners=cpu["runners"] / expected, cpu_boards=cpu["boards"] / expected,
        cpu_ray=cpu["ray"] / expected,
        busy=cpu["machine"] / cpu["capacity"], others=cpu["others"] / wall,
        writes_tx=per_s(counted.transactions), writes_stmt=per_s(counted.statements),
        handover_median=statistics.median(handover), handover_p95=pct(handover, 0.95),
        result_median=statistics.median(result), result_p95=pct(result, 0.95),
        ramp_s=max(starts) - min(starts), start_s=loop.first.at - called, runs=expected)


def one_run(url: str, folder: Path, name: str, boards: int, args: argparse.Namespace,
            profile: bool) -> tuple[Figures, Loop]:
    inventory = load_inventory(write_inventory(folder, boards, args.run_s))
    spec = load_spec(write_spec(folder, name, boards, args.runs_per_board, args.run_s))
    with Store.open(url) as store, counting(store) as counted, timing_loop(profile) as loop:
        before, called = cpu_s(), time.time()
        summary = run_experiment(RunRequest(spec, inventory, stream=io.StringIO()), store)
        total = cpu_s() - before
        if not summary.succeeded or summary.counts["ok"] != boards * args.runs_per_board:
            raise SystemExit(f"fleet: {name}: {summary.line()}")
        figures = measure(store, name, boards, args.runs_per_board, counted, loop, total,
                          called)
    shutil.rmtree(folder / "boards", ignore_errors=True)
    return figures, loop


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def postgres() -> Any:
    """A throw-away cluster (scripts/postgres.sh): yields a function making a fresh database."""
    # a folder of its own under /tmp: PostgreSQL's user must reach it (the bench's folder is
    # private to whoever runs it; scripts/postgres.sh hands this one to PostgreSQL's user)
    pg_dir = Path(tempfile.mkdtemp(prefix="bf-fleet-pg-"))
    started = subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "start",
                              str(pg_dir), str(free_port())], capture_output=True, text=True)
    if started.returncode != 0:
        raise SystemExit(f"fleet: cannot start PostgreSQL ({started.stderr.strip()}); "
                         "--stores sqlite measures without it")
    base = started.stdout.strip().splitlines()[-1]
    try:
        admin = create_engine(base, isolation_level="AUTOCOMMIT")
    except ModuleNotFoundError as exc:  # psycopg: the `test` extra (scripts/setup.sh test)
        subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "stop", str(pg_dir)],
                       capture_output=True)
        raise SystemExit(f"fleet: {exc}; install the test extra, or --stores sqlite") from exc

    def fresh(name: str) -> str:
        database = name.replace("-", "_")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {database}"))
        return base.rsplit("/", 1)[0] + "/" + database

    try:
        yield fresh
    finally:
        admin.dispose()
        subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "stop", str(pg_dir)],
                       capture_output=True)
        shutil.rmtree(pg_dir, ignore_errors=True)


HEADER = (f"{'boards':>6} {'store':<8} {'idle med':>8} {'idle max':>8} {'stand-in':>8} "
          f"{'CPU/run':>8} {'loop/run':>8} {'runners':>8} {'boards':>8} {'ray':>7} {'busy':>5} "
          f"{'others':>6} "
          f"{'tx/s':>6} {'stmt/s':>7} {'hand-over':>15} {'result':>15} {'ramp':>6} "
          f"{'start':>6}")


def row(boards: int, store: str, figures: list[Figures]) -> str:
    def med(attr: str) -> float:
        return statistics.median(getattr(f, attr) for f in figures)

    return (f"{boards:>6} {store:<8} {med('idle_median'):>7.1%} {med('idle_max'):>8.1%} "
            f"{med('standin_median'):>8.1%} {med('cpu_total') * 1000:>6.1f}ms "
            f"{med('cpu_loop') * 1000:>6.1f}ms {med('cpu_runners') * 1000:>6.1f}ms "
            f"{med('cpu_boards') * 1000:>6.1f}ms "
            f"{med('cpu_ray') * 1000:>5.1f}ms {med('busy'):>5.0%} {med('others'):>6.2f} "
            f"{med('writes_tx'):>6.0f} {med('writes_stmt'):>7.0f} "
            f"{med('handover_median') * 1000:>6.0f}/{med('handover_p95') * 1000:>5.0f} ms "
            f"{med('result_median') * 1000:>6.0f}/{med('result_p95') * 1000:>5.0f} ms "
            f"{med('ramp_s'):>5.2f}s {med('start_s'):>5.0f}s")


def store_cycle(url: str, boards: int, runs: int) -> str:
    """The driver's store work per run alone, without Ray: for each board in turn, as the
    scheduler does it, the take of its lease (handed over from its last run) with the done
    check and the attempt's ``running`` row, then the result (a stand-in run's: two steps, two
    fingerprints, an outcome) stored; CPU and wall per run, and the statements and commits."""
    store = Store.open(url)
    try:
        experiment = store.upsert_experiment("store-cycle", "", "0")
        devices = {f"b{i}": store.upsert_device(f"b{i}", "x86_64", "fleet", False, {})
                   for i in range(boards)}
        job = store.jobs.add("store-cycle", "store-cycle.toml", "", owner="bench",
                             holder="bench")
        turns = BoardTurns(Sharing(store, "bench", 30.0, "store-cycle", job),
                           store, Progress(boards * runs, list(devices), stream=io.StringIO()))
        with connect(local_device()) as transport:
            fingerprint = probe(transport)
        stdout = '{"schema": "lmc/1", "command": "generate", "tokens": [11, 12]}'

        def record(key: str, device: int, status: str) -> RunResult:
            return RunResult(run_key=key, experiment_id=experiment, device_id=device,
                             command="generate", status=status, policy="exact", threads=1,
                             config={"policy": "exact", "threads": 1, "workload": {"ctx": 128}})

        counted = Counter()

        def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
            counted["statements"] += 1

        def commit(conn: Any) -> None:
            counted["commits"] += 1

        event.listen(store.database, "before_cursor_execute", statement)
        event.listen(store.database, "commit", commit)
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(runs):
            for board, device in devices.items():
                key, started = f"{board}-{n}", {}

                def start(conn: Any, lease_id: str, key: str = key, device: int = device,
                          started: dict[str, int] = started) -> None:
                    attempt = record(key, device, "running")
                    attempt.lease_id = lease_id
                    started["id"] = store.start_measurement_on(conn, attempt)

                assert turns.take(board, key, done_check=True, start=start)
                result = record(key, device, "ok")
                result.lease_id = turns.lease_of(board)
                result.started_at = result.finished_at = datetime.now(UTC)
                result.wall_ms, result.engine_ms, result.raw_json = 1010.0, 1000.0, stdout
                result.token_timings = [TokenTiming(0, 11, 0.5, 0.1), TokenTiming(1, 12, 0.5)]
                result.snapshots = [records.Snapshot("before", fingerprint, result.started_at),
                                    records.Snapshot("after", fingerprint,
                                                     result.finished_at)]
                result.outcome = Outcome(generated_ids=[11, 12], text="", recall=0.0)
                store.save_run(result, started["id"])
                if n < runs - 1:
                    turns.keep(board)
                else:
                    turns.release(board)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        event.remove(store.database, "before_cursor_execute", statement)
        event.remove(store.database, "commit", commit)
    finally:
        store.close()
    total = boards * runs
    return (f"{cpu / total * 1000:5.2f} ms CPU, {wall / total * 1000:6.2f} ms wall, "
            f"{counted['statements'] / total:4.1f} statements and "
            f"{counted['commits'] / total:3.1f} commits per run [{boards} boards x {runs}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boards", default="16,32,64",
                        help="fleet sizes, comma-separated (default 16,32,64)")
    parser.add_argument("--run-s", type=float, default=1.0,
                        help="seconds each stand-in run sleeps (default 1)")
    parser.add_argument("--runs-per-board", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="of each size and store")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--profile", metavar="FILE",
                        help="cProfile the scheduler's loop of the last run into FILE")
    parser.add_argument("--store-cycle", type=int, default=0, metavar="RUNS",
                        help="instead: the driver's store work per run alone (no Ray), RUNS "
                             "runs on each of 16 boards, on each store")
    args = parser.parse_args()
    sizes = [int(n) for n in args.boards.split(",") if n.strip()]
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or args.runs_per_board < 2 or args.repeats < 1 \
            or args.run_s <= 0:
        parser.error("--boards >= 1, --runs-per-board >= 2, --repeats >= 1, --run-s > 0")
    if set(stores) - {"sqlite", "postgres"}:
        parser.error("--stores: sqlite and/or postgres")

    if args.store_cycle:
        folder = Path(tempfile.mkdtemp(prefix="bf-fleet-"))
        try:
            with postgres_if("postgres" in stores) as fresh_pg:
                print(f"store cycle; {uptime()}")
                for kind in stores:
                    url = (f"sqlite:///{folder / 'cycle'}.db" if kind == "sqlite"
                           else fresh_pg("store_cycle"))
                    print(f"  {kind:<8} {store_cycle(url, 16, args.store_cycle)}", flush=True)
                print(f"store cycle done; {uptime()}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    print(f"fleet: {args.runs_per_board} runs of {args.run_s:g} s per board, "
          f"{args.repeats} repeat(s), {os.cpu_count()} CPUs; {uptime()}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="bf-fleet-"))
    results: dict[tuple[int, str], list[Figures]] = defaultdict(list)
    last_loop: Loop | None = None
    try:
        with postgres_if("postgres" in stores) as fresh_pg, ray_session(None):
            for repeat in range(args.repeats):
                for boards in sizes:
                    for kind in stores:
                        name = f"fleet-{boards}-{kind}-{repeat}"
                        url = (f"sqlite:///{folder / name}.db" if kind == "sqlite"
                               else fresh_pg(name))
                        profile = bool(args.profile) and repeat == args.repeats - 1 and \
                            boards == sizes[-1] and kind == stores[-1]
                        figures, loop = one_run(url, folder, name, boards, args, profile)
                        results[(boards, kind)].append(figures)
                        last_loop = loop if profile else last_loop
                        print(f"  {name}: {row(boards, kind, [figures]).strip()}  "
                              f"[{uptime()}]", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\nmedians of {args.repeats} repeat(s); {uptime()}")
    print(HEADER)
    for boards in sizes:
        for kind in stores:
            print(row(boards, kind, results[(boards, kind)]))
    if last_loop is not None and last_loop.profile is not None:
        last_loop.profile.dump_stats(args.profile)
        print(f"profile of the last scheduler loop: {args.profile}")


@contextmanager
def postgres_if(wanted: bool) -> Any:
    if not wanted:
        yield None
        return
    with postgres() as fresh:
        yield fresh


if __name__ == "__main__":
    main()
