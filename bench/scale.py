"""A lab's year, reproducibly: grow a store to 1x / 10x / 100x (10k / 100k / 1M measurements) from
real engine output, then time every read command and every dashboard page and API endpoint.

    .venv/bin/python bench/scale.py [--sizes 1,10,100] [--backends sqlite,postgresql]
        [--repeats 5] [--requests 20] [--timeout 300] [--only PATTERN] [--seed 1]
        [--seed-db STORE.db] [--work DIR] [--rebuild] [--build-only] [--json OUT]

1. The seed: real runs. Without ``--seed-db`` it runs ``benchfarm demo`` once (builds lmc, the
   demo's needle matrix on this machine) into ``WORK/seed/demo.db``; with it, a copy of that
   store (the given file is only read). When the seed lacks ppl, decode or attn-bench runs,
   ``benchfarm demo --spec WORK/seed/extra.toml`` runs bench/scale_grow.py's ``EXTRA_SPEC``
   (pydoc-lm: ppl, decode at 256 and 1024 tokens, attn-bench; exact, sparse, window, h2o,
   quest) into ``WORK/seed/extra.db``. Both are kept and reused.
2. The growth (bench/scale_grow.py): ~500 experiments at 100x (5 per 1x), 50 boards,
   ``nightly`` of 50 configs x 10 / 100 / 1,000 engine revisions with planted steps,
   ``exp-1k`` of exactly 1,000 runs, retries, failures, runs in flight, jobs, board states.
   Each store lives in ``WORK/<backend>-<size>x`` (PostgreSQL: a database ``scale_<size>x`` of
   a cluster in ``WORK/pg`` started by scripts/postgres.sh and stopped at the end) with
   ``built.json``: it is reused while the seed's templates, the size, ``--seed``, this growth's
   code and db/'s code are the same (``--rebuild`` forces it). Prints measurements per second
   of the growth and the store's bytes per measurement.
3. The timings: each read command as a subprocess (``python -m harness.cli --db URL ...``),
   ``--repeats`` times (median, min, max; a command whose runs exceed ``--timeout`` in all is
   not repeated further, and one that exceeds it once is reported as a timeout); the dashboard
   (``benchfarm web``) with every page and API endpoint requested ``--requests`` times after
   one warm-up (p50, p95; the server is restarted after a request that timed out). One table
   per backend: rows the reads, columns the sizes, with the targets and whether the largest
   size measured meets them (the targets are stated for 100x). ``history nightly`` is compared
   with the planted steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import scale_grow  # noqa: E402
from scale_grow import EXTRA_SPEC, Plan, Template, load_templates  # noqa: E402

DEFAULT_WORK = Path("/tmp/benchfarm-scale")
CLI = [sys.executable, "-m", "harness.cli"]
CLAIMS = "seed_000_sparse_topk.toml"  # the claims file the audit endpoints judge


@dataclass(frozen=True)
class Read:
    """A read to time: a CLI command (argv) or a dashboard path, and its target."""

    name: str
    argv: tuple[str, ...] = ()  # CLI arguments after --db URL, with {placeholders}
    path: str = ""  # a dashboard path, with {placeholders}
    target_s: float | None = None  # at 100x: the median (CLI) or p95 (dashboard)
    relative: bool = False  # also within 20 % of its time at 1x

    @property
    def web(self) -> bool:
        return bool(self.path)


READS = (
    Read("(start-up: --help)", ("--help",)),  # what every command pays before reading
    Read("status", ("status",), target_s=1.0),
    Read("status exp-1k", ("status", "exp-1k"), target_s=1.0, relative=True),
    Read("status nightly", ("status", "nightly")),
    Read("runs list --experiment exp-1k", ("runs", "list", "--experiment", "exp-1k"),
         target_s=1.0, relative=True),
    Read("runs show RUN", ("runs", "show", "{run}")),
    Read("report exp-1k", ("report", "exp-1k", "--out", "{out}/report-exp-1k"), target_s=5.0,
         relative=True),
    Read("history nightly", ("history", "nightly", "--metric", "decode_ms_per_token", "--json"),
         target_s=10.0),
    Read("report nightly", ("report", "nightly", "--out", "{out}/report-nightly"),
         target_s=30.0),
    Read("compare A B --experiment exp-1k", ("compare", "{a}", "{b}", "--experiment", "exp-1k")),
    # every experiment holding runs of the two boards (exp-1k's pair: a tenth of the store)
    Read("compare A B", ("compare", "{a}", "{b}")),
    Read("export exp-1k --format csv", ("export", "exp-1k", "--format", "csv", "--out",
                                         "{out}/export")),
    Read("queue --all", ("queue", "--all")),
    Read("devices list", ("devices", "list", "--inventory", "{inventory}")),
    Read("logs JOB", ("logs", "{job}")),
    Read("alerts list", ("alerts", "list")),
    Read("web /", path="/", target_s=0.3),
    Read("web /experiments/exp-1k", path="/experiments/exp-1k", target_s=1.0),
    Read("web /experiments/nightly", path="/experiments/nightly", target_s=1.0),
    Read("web /api/boards", path="/api/boards", target_s=0.3),
    Read("web /api/jobs", path="/api/jobs", target_s=0.3),
    Read("web /api/jobs/{id}", path="/api/jobs/{job}", target_s=0.3),
    Read("web /jobs/{id}", path="/jobs/{job}", target_s=0.3),
    Read("web /experiments", path="/experiments", target_s=0.3),
    Read("web /api/timeline", path="/api/timeline", target_s=0.3),
    Read("web /alerts", path="/alerts", target_s=0.3),
    Read("web /api/alerts", path="/api/alerts", target_s=0.3),
    Read("web /api/experiments", path="/api/experiments", target_s=0.3),
    Read("web /api/experiments/exp-1k", path="/api/experiments/exp-1k", target_s=0.3),
    Read("web /api/experiments/nightly", path="/api/experiments/nightly", target_s=0.3),
    Read("web /audit", path="/audit", target_s=0.3),
    Read(f"web /audit/{CLAIMS}", path=f"/audit/{CLAIMS}", target_s=0.3),
    Read(f"web /api/audit/{CLAIMS}", path=f"/api/audit/{CLAIMS}", target_s=0.3),
    Read("web /static/live.js", path="/static/live.js", target_s=0.3),
)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def size_label(factor: float) -> str:
    return f"{factor:g}x"


# -- the seed ----------------------------------------------------------------------------------


def seed_run(store: Path, args: list[str], tries: int = 3) -> None:
    """`benchfarm --db sqlite:///STORE ARGS` (a demo) into a fresh store, renamed into place
    once it succeeded; tried again when it fails (Ray's start times out on a loaded host)."""
    partial = store.with_name(store.name + ".partial")
    for attempt in range(1, tries + 1):
        for path in partial.parent.glob(partial.name + "*"):
            path.unlink()
        argv = [*CLI, "--db", f"sqlite:///{partial}", *args]
        done = subprocess.run(argv, cwd=REPO, env=cli_env(), capture_output=True, text=True,
                              timeout=3600)
        if done.returncode == 0:
            for suffix in ("-wal", "-shm", ""):  # the main file last: it marks the seed made
                if Path(f"{partial}{suffix}").exists():
                    Path(f"{partial}{suffix}").rename(f"{store}{suffix}")
            return
        log(f"scale: `benchfarm {' '.join(argv[3:])}` failed (exit {done.returncode}, try "
            f"{attempt} of {tries}):\n{done.stderr[-1500:]}")
    raise SystemExit(f"scale: could not make the seed store {store}")


def seed_templates(work: Path, seed_db: Path | None) -> list[Template]:
    """The templates of the seed stores (running the demo, and the extra spec, when needed)."""
    folder = work / "seed"
    folder.mkdir(parents=True, exist_ok=True)
    if seed_db is not None:
        main = folder / "given.db"
        if not main.exists() or main.stat().st_mtime < seed_db.stat().st_mtime:
            for suffix in ("", "-wal"):  # a copy: the given store is never opened for writing
                source = Path(f"{seed_db}{suffix}")
                if source.exists():
                    shutil.copyfile(source, f"{main}{suffix}")
    else:
        main = folder / "demo.db"
        if not main.exists():
            log(f"scale: running `benchfarm demo` into {main} (builds lmc; a few minutes)")
            seed_run(main, ["demo", "--out", str(folder / "demo-report")])
    paths = [main]
    kinds = {t.kind for t in load_templates(paths)}
    if not {"ppl", "decode", "attn-bench"} <= kinds:
        extra = folder / "extra.db"
        if not extra.exists():
            spec = folder / "extra.toml"
            spec.write_text(EXTRA_SPEC.format(repo=REPO))
            log(f"scale: the seed lacks {sorted({'ppl', 'decode', 'attn-bench'} - kinds)}: "
                f"running {spec} into {extra}")
            seed_run(extra, ["demo", "--spec", str(spec), "--out", str(folder / "extra-report")])
        paths.append(extra)
    templates = load_templates(paths)
    counts: dict[str, int] = {}
    for t in templates:
        counts[f"{t.command}/{t.kind}"] = counts.get(f"{t.command}/{t.kind}", 0) + 1
    log(f"scale: {len(templates)} templates from {', '.join(map(str, paths))}: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return templates


def templates_hash(templates: list[Template]) -> str:
    text = json.dumps([asdict(t) for t in templates], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# what decides the bytes of a grown store: the growth and the store's writing code and schema
# (a change to a read leaves the stores as they are)
WRITERS = ("bench/scale_grow.py", "reports/baseline.py", "db/models.py", "db/rows.py",
           "db/packing.py", "db/store.py", "db/connection.py", "db/records.py")


def code_hash() -> str:
    """The growth's code and the store's writes and schema: a store they would build otherwise
    is built again."""
    digest = hashlib.sha256()
    for path in [*(REPO / name for name in WRITERS),
                 *sorted((REPO / "db" / "migrations").rglob("*.py"))]:
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# -- PostgreSQL --------------------------------------------------------------------------------


class Postgres:
    """A throw-away cluster (scripts/postgres.sh) with a database per size."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.url = ""

    def start(self) -> None:
        done = subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "start",
                               str(self.folder), str(self.port)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"scale: scripts/postgres.sh start failed: {done.stderr.strip()}")
        self.url = done.stdout.strip().splitlines()[-1]
        log(f"scale: PostgreSQL at {self.url}")

    def stop(self) -> None:
        if self.url:
            subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "stop",
                            str(self.folder)], capture_output=True, text=True)
            self.url = ""

    def database_url(self, name: str) -> str:
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def _admin(self, statement: str) -> list[Any]:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                result = conn.execute(text(statement))
                return list(result) if result.returns_rows else []
        finally:
            engine.dispose()

    def exists(self, name: str) -> bool:
        return bool(self._admin(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"))

    def recreate(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}"')
        self._admin(f'CREATE DATABASE "{name}"')

    def size(self, name: str) -> int:
        return int(self._admin(f"SELECT pg_database_size('{name}')")[0][0])

    def table_bytes(self, name: str) -> dict[str, int]:
        """Each table's bytes with its indexes and TOAST."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.database_url(name))
        try:
            with engine.connect() as conn:
                rows = conn.execute(text(
                    "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = "
                    "'r' AND relnamespace = 'public'::regnamespace")).all()
        finally:
            engine.dispose()
        return {str(table): int(size) for table, size in rows}


def sqlite_table_bytes(path: Path) -> dict[str, int]:
    """Each table's and index's pages (SQLite's dbstat; empty where it is not compiled in)."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return {}
    return {str(table): int(size) for table, size in rows}


# -- built stores ------------------------------------------------------------------------------


@dataclass
class Built:
    backend: str
    size: str
    url: str
    manifest: dict[str, Any]
    bytes: int
    reused: bool
    tables: dict[str, int] = field(default_factory=dict)  # bytes per table (and index)


def built_store(backend: str, factor: float, args: argparse.Namespace,
                templates: list[Template], key_parts: dict[str, Any],
                pg: Postgres | None) -> Built:
    from db import Store

    label = size_label(factor)
    plan = Plan.for_size(factor)
    key = hashlib.sha256(json.dumps({**key_parts, "plan": asdict(plan), "seed": args.seed,
                                     "backend": backend}, sort_keys=True).encode()).hexdigest()
    if backend == "sqlite":
        folder = args.work / f"sqlite-{label}"
        marker = folder / "built.json"
        path = folder / "store.db"
        url = f"sqlite:///{path}"
        present = path.exists()
    else:
        assert pg is not None
        name = f"scale_{label.replace('.', '_')}"
        folder = args.work / "pg"
        marker = folder / f"{name}.json"
        url = pg.database_url(name)
        present = pg.exists(name)
    if marker.exists() and present and not args.rebuild:
        saved = json.loads(marker.read_text())
        if saved.get("key") == key:
            log(f"scale: reusing the {backend} store of {label} ({url})")
            if "steps_seconds" not in saved["manifest"]:
                saved["manifest"]["steps_seconds"] = keep_steps(url)
                marker.write_text(json.dumps(saved, indent=1))
            return Built(backend, label, url, saved["manifest"], saved["bytes"], True,
                         saved.get("tables", {}))
    log(f"scale: growing the {backend} store of {label}: {plan.measurements:,} measurements, "
        f"{plan.experiments} experiments, nightly {plan.configs} x {plan.revisions}")
    marker.unlink(missing_ok=True)
    if backend == "sqlite":
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        pg.recreate(name)
    store = Store.open(url)
    try:
        manifest = scale_grow.grow(store, templates, plan, args.seed, progress=log)
    finally:
        store.close()
    if backend == "sqlite":
        size = sum(p.stat().st_size for p in folder.glob("store.db*"))
        tables = sqlite_table_bytes(path)
    else:
        size, tables = pg.size(name), pg.table_bytes(name)
    document = asdict(manifest)
    document["steps_seconds"] = keep_steps(url)
    marker.write_text(json.dumps({"key": key, "manifest": document, "bytes": size,
                                  "tables": tables}, indent=1))
    return Built(backend, label, url, document, size, False, tables)


def keep_steps(url: str) -> float:
    """Find and keep the steps of the histories the reads show, as a coordinator does once
    its runs landed (harness.execution.coordinator.keep_history): reports and pages read them
    and do not fit them. Returns the seconds it took."""
    from db import Store
    from harness.identity import commit_order
    from reports.history import keep_steps_of

    started = time.perf_counter()
    with Store.open(url) as store:
        for experiment in (scale_grow.NIGHTLY, scale_grow.EXP_1K):
            keep_steps_of(store, experiment, commit_order)
    seconds = time.perf_counter() - started
    log(f"scale: the steps of {scale_grow.NIGHTLY} and {scale_grow.EXP_1K} found and kept in "
        f"{seconds:,.1f} s (once, when their runs land)")
    return seconds


def growth_line(built: Built) -> str:
    m = built.manifest
    c = m["counts"]
    rate = c["measurements"] / m["seconds"] if m["seconds"] else 0.0
    writes = (f"{c['measurements'] / m['write_seconds']:,.0f} measurements/s"
              if m.get("write_seconds") else "not recorded")
    total = sum(built.tables.values()) or 1
    largest = ", ".join(f"{table} {size / 1e6:,.1f} MB ({size / total:.0%})" for table, size in
                        sorted(built.tables.items(), key=lambda item: -item[1])[:5])
    return (f"{built.backend} {built.size}: {c['experiments']} experiments, {c['runs']:,} runs, "
            f"{c['measurements']:,} measurements, {c['token_timings']:,} token timings, "
            f"{c['snapshots']:,} snapshots, {c['builds']:,} builds, {c['boards']} boards, "
            f"{c['jobs']:,} jobs; {built.bytes / 1e6:,.1f} MB = "
            f"{built.bytes / max(1, c['measurements']):,.0f} bytes per measurement; grown in "
            f"{m['seconds']:,.0f} s = {rate:,.0f} measurements/s "
            f"({c['measurements'] / max(m['cpu_seconds'], 1e-9):,.0f} per CPU second of the "
            f"writer; the store's writes alone {writes}){' (reused)' if built.reused else ''}"
            + (f"; steps kept in {m['steps_seconds']:,.1f} s" if "steps_seconds" in m else "")
            + (f"; the largest tables and indexes: {largest}" if largest else ""))


# -- timing ------------------------------------------------------------------------------------


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.pop("BENCHFARM_DB", None)
    return env


@dataclass
class Timing:
    """One read at one size: seconds per run (CLI) or per request (dashboard)."""

    samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # CPU seconds of the command (the server)
    first: float | None = None  # the dashboard's warm-up request
    timeout: bool = False
    error: str | None = None
    asked: int = 0
    load: list[float] = field(default_factory=list)  # load average when it started

    def value(self, web: bool) -> float | None:
        """What the target is checked against: the median, or the p95 of a dashboard path."""
        if self.timeout or self.error or not self.samples:
            return None
        return percentile(self.samples, 95) if web else statistics.median(self.samples)

    def cpu_cell(self, web: bool) -> str:
        """The CPU time the reads took (steadier than wall time on a shared host)."""
        if not self.cpu:
            return "–"
        if web:
            return (f"{percentile(self.cpu, 50) * 1e3:,.0f} / "
                    f"{percentile(self.cpu, 95) * 1e3:,.0f} ms")
        return f"{seconds(statistics.median(self.cpu))}"

    def cell(self, web: bool) -> str:
        if self.timeout:
            return "timeout" + (f" (after {len(self.samples)})" if self.samples else "")
        if self.error:
            return f"error: {self.error[:40]}"
        if not self.samples:
            return "–"
        short = f" n={len(self.samples)}" if len(self.samples) < self.asked else ""
        if web:
            return (f"{percentile(self.samples, 50) * 1e3:,.0f} / "
                    f"{percentile(self.samples, 95) * 1e3:,.0f} ms{short}")
        return (f"{seconds(statistics.median(self.samples))} [{seconds(min(self.samples))}, "
                f"{seconds(max(self.samples))}]{short}")


def seconds(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(argv: list[str], timeout: float) -> tuple[float | None, float, int, str, str]:
    """(seconds or None on a timeout, CPU seconds, exit code, stdout, stderr) of one CLI
    run (its CPU time with that of the processes it waited for, git's for instance)."""
    start, cpu = time.perf_counter(), children_cpu()
    proc = subprocess.Popen(argv, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, 0.0, -9, "", ""
    return time.perf_counter() - start, children_cpu() - cpu, proc.returncode, out, err


def time_cli(read: Read, url: str, values: dict[str, str], args: argparse.Namespace,
             keep: dict[str, str]) -> Timing:
    argv = [*CLI, "--db", url, *(a.format(**values) for a in read.argv)]
    timing = Timing(asked=args.repeats, load=list(os.getloadavg()))
    spent = 0.0
    for _ in range(args.repeats):
        took, cpu, code, out, err = run_once(argv, args.timeout)
        if took is None:
            timing.timeout = True
            break
        if code != 0:
            lines = (err.strip() or out.strip() or f"exit {code}").splitlines()
            timing.error = f"exit {code}: {lines[-1]}"
            break
        timing.samples.append(took)
        timing.cpu.append(cpu)
        keep.setdefault(read.name, out)
        spent += took
        if spent > args.timeout:  # enough of a slow one
            break
    return timing


class Dashboard:
    """`benchfarm web` on a free port, restarted when a request timed out."""

    def __init__(self, url: str, log_path: Path) -> None:
        self.url, self.log_path = url, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        out = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*CLI, "--db", self.url, "web", "--port", str(self.port), "--claims",
             str(REPO / "claims")], cwd=REPO, env=cli_env(), stdout=out, stderr=out,
            start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"scale: benchfarm web exited {self.proc.returncode}; see "
                                 f"{self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"scale: benchfarm web did not listen within 120 s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def cpu(self) -> float:
        """The server's CPU seconds so far (with the processes it waited for, git's)."""
        assert self.proc is not None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2:].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def get(self, path: str, timeout: float) -> tuple[float | None, int, bytes]:
        import http.client

        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
        except TimeoutError:
            return None, 0, b""
        except OSError as exc:  # the server went away
            return time.perf_counter() - start, -1, str(exc).encode()
        finally:
            conn.close()
        return time.perf_counter() - start, response.status, body


def time_web(read: Read, server: Dashboard, values: dict[str, str],
             args: argparse.Namespace, keep: dict[str, str]) -> Timing:
    path = read.path.format(**values)
    timing = Timing(asked=args.requests, load=list(os.getloadavg()))
    spent = 0.0
    for n in range(args.requests + 1):
        cpu = server.cpu()
        took, status, body = server.get(path, args.timeout)
        if took is None:
            timing.timeout = True
            server.stop()  # it is still working on the request: start afresh
            server.start()
            break
        if status != 200:
            timing.error = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
            break
        if n == 0:
            timing.first = took
            keep.setdefault(read.name, body.decode("utf-8", "replace"))
        else:
            timing.samples.append(took)
            timing.cpu.append(server.cpu() - cpu)
        spent += took
        if spent > args.timeout:
            break
    return timing


def time_reads(built: Built, args: argparse.Namespace, reads: list[Read],
               inventory: Path) -> tuple[dict[str, Timing], dict[str, str]]:
    out = args.work / "out" / f"{built.backend}-{built.size}"
    out.mkdir(parents=True, exist_ok=True)
    m = built.manifest
    values = {"run": m["sample_run"], "out": str(out), "a": m["compare_boards"][0],
              "b": m["compare_boards"][-1], "inventory": str(inventory),
              "job": str(m["sample_job"])}
    timings: dict[str, Timing] = {}
    outputs: dict[str, str] = {}
    for read in (r for r in reads if not r.web):
        log(f"scale: {built.backend} {built.size}: {read.name} ...")
        timings[read.name] = time_cli(read, built.url, values, args, outputs)
        log(f"scale:   {timings[read.name].cell(False)} s (CPU "
            f"{timings[read.name].cpu_cell(False)} s)")
    web = [r for r in reads if r.web]
    if web:
        server = Dashboard(built.url, out / "web.log")
        server.start()
        try:
            for read in web:
                log(f"scale: {built.backend} {built.size}: {read.name} ...")
                timings[read.name] = time_web(read, server, values, args, outputs)
                first = timings[read.name].first
                log(f"scale:   {timings[read.name].cell(True)}"
                    + ("" if first is None else f" (first {first * 1e3:,.0f} ms)")
                    + f" (CPU {timings[read.name].cpu_cell(True)})")
        finally:
            server.stop()
    return timings, outputs


def planted_check(manifest: dict[str, Any], history_json: str | None) -> str:
    """`history nightly --json`'s steps against the planted ones."""
    if not history_json:
        return "history nightly: no output to compare with the planted steps"
    steps = json.loads(history_json).get("steps", [])
    found, missed = 0, []
    matched: set[int] = set()
    for plant in manifest["planted"]:
        hit = next((i for i, s in enumerate(steps)
                    if s["revision"] == plant["revision"] and s["device"] == plant["device"]
                    and s.get("ratio") and abs(s["ratio"] / plant["factor"] - 1) < 0.1
                    and i not in matched), None)
        if hit is None:
            missed.append(f"x{plant['factor']} at revision {plant['revision_index']} on "
                          f"{plant['device']} (series {plant['series']})")
        else:
            matched.add(hit)
            found += 1
    line = (f"history nightly: {found} of {len(manifest['planted'])} planted steps found at "
            f"their revision, {len(steps) - len(matched)} other steps")
    return line + (f"; missed: {'; '.join(missed)}" if missed else "")


# -- tables ------------------------------------------------------------------------------------


def target_text(read: Read) -> str:
    if read.target_s is None:
        return "–"
    what = "p95" if read.web else "median"
    limit = f"{read.target_s * 1e3:.0f} ms" if read.target_s < 1 else f"{read.target_s:g} s"
    return f"{what} <= {limit}" + ("; <= 1.2x 1x" if read.relative else "")


def met(read: Read, by_size: dict[str, Timing], largest: str) -> str:
    if read.target_s is None or largest not in by_size:
        return "–"
    value = by_size[largest].value(read.web)
    if value is None:
        return "no"
    ok = value <= read.target_s
    if read.relative and largest != "1x" and "1x" in by_size:
        base = by_size["1x"].value(read.web)
        ok = ok and base is not None and value <= 1.2 * base
    return "yes" if ok else "no"


def table(backend: str, sizes: list[str], reads: list[Read],
          results: dict[str, dict[str, Timing]], loads: dict[str, str]) -> str:
    largest = sizes[-1]
    head = ["read", *sizes, "target (at 100x)", f"met at {largest}"]
    rows = []
    for read in reads:
        by_size = {size: results[size][read.name] for size in sizes
                   if read.name in results.get(size, {})}
        rows.append([read.name, *(by_size[s].cell(read.web) if s in by_size else "–"
                                  for s in sizes), target_text(read), met(read, by_size,
                                                                          largest)])
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = [f"{backend}: CLI: seconds, median [min, max] of the repeats; dashboard: p50 / p95 "
             "ms of the requests after one warm-up",
             *(f"  load average while timing {size}: {loads[size]}" for size in sizes
               if size in loads),
             "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
              for row in rows]
    return "\n".join(lines)


def cpu_table(backend: str, sizes: list[str], reads: list[Read],
              results: dict[str, dict[str, Timing]]) -> str:
    """The CPU time of the same reads: the command's (median, s) or the server's per request
    (p50 / p95, ms): what the reads cost whatever else the host runs."""
    head = ["read (CPU)", *sizes]
    rows = [[read.name, *(results[size][read.name].cpu_cell(read.web)
                          if read.name in results.get(size, {}) else "–" for size in sizes)]
            for read in reads]
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = [f"{backend}: CPU time: the command's, seconds (median), or the dashboard "
             "server's per request, ms (p50 / p95)",
             "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
              for row in rows]
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def numbers(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas"
                                         ) from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes > 0")
    return values


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=numbers, default=[1.0, 10.0, 100.0],
                        help="store sizes in units of 10,000 measurements (default 1,10,100)")
    parser.add_argument("--backends", default="sqlite,postgresql",
                        help="sqlite, postgresql or both (default %(default)s)")
    parser.add_argument("--repeats", type=positive, default=5, help="runs of each command")
    parser.add_argument("--requests", type=positive, default=20,
                        help="requests of each dashboard path after one warm-up")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a command or a request may take (default %(default)s)")
    parser.add_argument("--only", help="time only the reads whose name matches this regex")
    parser.add_argument("--seed", type=int, default=1, help="the growth's seed")
    parser.add_argument("--seed-db", type=Path,
                        help="a store of real runs to use as the seed (read, never written) "
                             "instead of running the demo")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK,
                        help="where the seed and the built stores are kept (default %(default)s)")
    parser.add_argument("--rebuild", action="store_true", help="grow the stores again")
    parser.add_argument("--build-only", action="store_true", help="grow the stores, time nothing")
    parser.add_argument("--pg-port", type=int, default=55439)
    parser.add_argument("--json", type=Path, help="also write every timing here")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for backend in args.backends:
        if backend not in ("sqlite", "postgresql"):
            parser.error(f"--backends: {backend!r} is neither sqlite nor postgresql")
    if args.only:
        try:
            re.compile(args.only)
        except re.error as exc:
            parser.error(f"--only {args.only!r}: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    templates = seed_templates(args.work, args.seed_db)
    key_parts = {"templates": templates_hash(templates), "code": code_hash()}
    inventory = args.work / "inventory.toml"
    inventory.write_text(scale_grow.inventory_toml(
        scale_grow.make_boards(Plan.for_size(1), args.seed)))
    reads = [r for r in READS if not args.only or re.search(args.only, r.name)]
    sizes = sorted(args.sizes)
    pg = None
    if "postgresql" in args.backends:
        pg = Postgres(args.work / "pg", args.pg_port)
        pg.start()
    report: dict[str, Any] = {"sizes": [size_label(s) for s in sizes], "backends": {}}
    tables, growth, checks = [], [], []
    try:
        for backend in args.backends:
            results: dict[str, dict[str, Timing]] = {}
            loads: dict[str, str] = {}
            entry = report["backends"].setdefault(backend, {})
            for factor in sizes:
                built = built_store(backend, factor, args, templates, key_parts, pg)
                growth.append(growth_line(built))
                log("scale: " + growth[-1])
                entry[built.size] = {"url": built.url, "bytes": built.bytes,
                                     "manifest": built.manifest, "reused": built.reused}
                if args.build_only or not reads:
                    continue
                before = os.getloadavg()
                results[built.size], outputs = time_reads(built, args, reads, inventory)
                after = os.getloadavg()
                loads[built.size] = (f"{before[0]:.1f} at the start, {after[0]:.1f} at the end "
                                     "(1-minute)")
                if "history nightly" in results[built.size]:
                    checks.append(f"{backend} {built.size}: " + planted_check(
                        built.manifest, outputs.get("history nightly")))
                    log("scale: " + checks[-1])
                entry[built.size]["timings"] = {name: asdict(t) for name, t in
                                                results[built.size].items()}
                entry[built.size]["load"] = loads[built.size]
            if results:
                labels = [size_label(s) for s in sizes]
                tables.append(table(backend, labels, reads, results, loads))
                tables.append(cpu_table(backend, labels, reads, results))
    finally:
        if pg is not None:
            pg.stop()
    print("\n".join(["growth:", *growth]))
    if checks:
        print("\n".join(["", *checks]))
    for text in tables:
        print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
