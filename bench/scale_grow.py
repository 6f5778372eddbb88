"""A lab's year of runs, grown from real engine output: the growth step of bench/scale.py.

The seed is a store of real runs (``benchfarm demo``'s needle matrix, and a small spec of the
kinds the demo lacks: ppl, decode and attn-bench, see ``EXTRA_SPEC``). Each of its ok runs
becomes a template: the run's config and axes, the engine's raw JSON, its token timings, its
outcome, its workload and model rows. ``grow`` writes a store of ``Plan.measurements``
measurements from them through the store's public API only (``Store.upsert_*``,
``record_build``, ``save_run`` or the bulk ``save_runs`` where the store has it,
``start_measurement``, ``link_runs``, ``store.jobs``, ``store.boards``, ``store.leases``):

- ~50 boards of four classes (RK3588, Raspberry Pi 5, Jetson Orin, x86 servers), each with its
  own speed, clocks, temperatures and load, and fingerprints before and after each attempt in
  the format ``devices.fingerprint`` stores (with the flags ``devices.conditions`` computes);
- builds per engine revision (one per target), revisions named by 40 hex digits whose first
  four count the revisions, so that their sorted order is their order in time (git does not
  know them: ``benchfarm history`` keeps the order of the runs, the dashboard sorts them);
- ``nightly``: ``Plan.configs`` configs x ``Plan.revisions`` revisions, one run per config and
  revision, with steps planted at known revisions (``Manifest.planted``: decode timings, the
  token timings and the raw JSON's, scaled by a factor from that revision on);
- ``exp-1k``: exactly ``Plan.exp_runs`` runs (1,000: the target's "experiment of 1,000 runs"),
  needle runs on two boards (``Manifest.compare_boards``);
- the other experiments, of sizes drawn from a log-normal, each of one kind of work (or mixed)
  on one to four boards of a class, at the engine revision current at its time (some compare
  two revisions), some linking an earlier experiment's runs;
- per run 1-3 attempts: retries after a lost or failed attempt, final failures, pending,
  interrupted and cancelled runs, and a few attempts still running under a live lease;
- jobs (one per experiment, one per revision of the nightly; one running and one queued),
  board states, health checks (with each board's measured limits, ``Board.limits``, so that
  history and the reports compute every figure's roofline share) and reservations.

Everything is drawn from ``random.Random`` seeded by ``(seed, what)``: the same seed stores and
the same seed give the same rows (but the timestamps the store takes itself: jobs, health
checks, reservations, leases). Measurements are written in the order of their start times
across experiments, as a lab's coordinators would have written them.
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from db import Outcome, RunResult, Snapshot, Store, TokenTiming  # noqa: E402
from db.limits import FMA_GFLOPS, READ_CURVE, READ_GBPS  # noqa: E402
from devices.conditions import snapshot_flags  # noqa: E402
from reports.baseline import keep_baseline_of  # noqa: E402

# the spec of the templates the demo lacks, run by `benchfarm demo --spec` on this machine
EXTRA_SPEC = """\
# bench/scale.py's seed: the kinds of runs the demo lacks (ppl, decode, attn-bench), with the
# shipped pydoc-lm model, run once on this machine by `benchfarm demo --spec`.
name = "scale-seed-extra"
description = "bench/scale.py's templates the demo lacks: ppl, decode and attn-bench"
model = "{repo}/models/pydoc-lm"
devices = ["local"]
repeats = 1
warmups = 0

[engine.policy.exact]

[engine.policy.sparse]
k = 8

[engine.policy.window]
kv_budget = 256

[engine.policy.h2o]
kv_budget = 256

[engine.policy.quest]
k = 8

[[workload]]
kind = "ppl"
length = 512
seed = 0
text = "{repo}/models/pydoc-lm/heldout.txt"

[[workload]]
kind = "decode"
ctx = [256, 1024]
max_new = 32

[[workload]]
kind = "attn-bench"
ctx = 2048
heads = 8
kv_heads = 4
head_dim = 64
runs = 3
"""

YEAR_START = datetime(2025, 12, 1)  # naive UTC, as the store keeps times
YEAR_S = 365 * 86400.0
KINDS = ("needle", "decode", "ppl", "attn-bench")
# (series index, where in the revisions, factor): the nightly's planted steps
STEP_PLAN = ((0, 0.30, 1.30), (0, 0.70, 0.80), (7, 0.50, 1.25), (13, 0.20, 0.75),
             (22, 0.85, 1.40), (31, 0.60, 1.20), (44, 0.40, 0.70))
NIGHTLY, EXP_1K = "nightly", "exp-1k"
LOST_ERROR = ("its coordinator stopped while it was in flight (the board's lease expired)")
FAILURES = ("lmc exited with code 139 (SIGSEGV)",
            "run timed out after 900 s",
            "ssh: connect to host {host} port 22: Connection timed out",
            "engine output refused: expected a JSON document from lmc (schema lmc/1), got "
            "nothing on stdout",
            "lmc: cannot map model.safetensors: No space left on device")


# -- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to grow. ``for_size(f)``: f x 10,000 measurements, 5 f experiments, 10 f nightly
    revisions (1x, 10x, 100x: 10k / 100k / 1M measurements, 5 / 50 / 500 experiments,
    10 / 100 / 1,000 revisions); ``exp-1k`` holds 1,000 runs and the nightly 50 configs at
    every size."""

    measurements: int
    experiments: int  # all of them, exp-1k and nightly included
    revisions: int  # the nightly's engine revisions
    configs: int = 50  # the nightly's configs (series)
    exp_runs: int = 1000  # exp-1k's runs
    boards: int = 50

    @classmethod
    def for_size(cls, factor: float) -> Plan:
        """Below 1x (for trying the bench out) exp-1k and the nightly's configs shrink too."""
        small = min(1.0, factor)
        return cls(measurements=round(10_000 * factor), experiments=max(3, round(5 * factor)),
                   revisions=max(3, round(10 * factor)), configs=max(2, round(50 * small)),
                   exp_runs=max(10, round(1000 * small)))


@dataclass
class Manifest:
    """What a grown store holds, for the timings and for checks (bench/scale.py keeps it as
    JSON beside the store)."""

    plan: dict[str, Any]
    seed: int
    counts: dict[str, int] = field(default_factory=dict)
    planted: list[dict[str, Any]] = field(default_factory=list)  # the nightly's steps
    sample_run: str = ""  # a run key of exp-1k with token timings (`runs show`)
    sample_job: int = 0  # a job id (`/api/jobs/{id}`)
    compare_boards: list[str] = field(default_factory=list)  # exp-1k's two boards
    revisions: list[str] = field(default_factory=list)  # the nightly's, in order
    seconds: float = 0.0  # the growth's wall time
    cpu_seconds: float = 0.0  # this process's CPU time in it
    write_seconds: float = 0.0  # the wall time inside the store's writes of the measurements


# -- templates from the seed stores ----------------------------------------------------------


@dataclass
class Template:
    """One real run of a seed store, to be replayed with other timings, boards and revisions."""

    command: str
    kind: str  # the workload's kind
    config: dict[str, Any]
    axes: dict[str, Any]  # the runs' axis columns
    figures: dict[str, Any]  # prefill_ms, decode/attn ms per token, prompt tokens, wall ...
    doc: dict[str, Any]  # the engine's raw JSON, parsed
    timings: list[tuple[int, float, float | None]]  # token, ms, attn_ms per decode step
    outcome: dict[str, Any] | None
    workload: dict[str, Any]
    model: dict[str, Any] | None
    schema: str  # the fingerprints' schema
    label: str


AXES = ("policy", "k", "block", "probes", "kv", "wq", "threads", "prefill_attn")
FIGURES = ("prefill_ms", "decode_ms_per_token", "attn_ms_per_token", "prompt_tokens",
           "wall_ms", "engine_ms", "overhead_ms", "exit_code")


def load_templates(paths: list[Path]) -> list[Template]:
    """The ok runs of the seed stores (SQLite files, read through Store.get_run) as templates,
    one per (command, workload, config), in a fixed order."""
    found: dict[str, Template] = {}
    for path in paths:
        store = Store.open(f"sqlite:///{path}", create=False)
        try:
            for listing in store.list_runs(status="ok"):
                detail = store.get_run(listing.id)
                template = _template(detail)
                if template is not None:
                    found.setdefault(template.label, template)
        finally:
            store.close()
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found.values(), key=lambda t: (order.get(t.kind, 9), t.label))


def _template(detail: Any) -> Template | None:
    run = detail.run
    if not run.get("raw_json") or detail.workload is None:
        return None
    workload = {k: detail.workload[k] for k in ("kind", "params", "content_hash", "ids",
                                                "answer", "needle_span")}
    model = None if detail.model is None else {k: detail.model[k]
                                               for k in ("path", "sha256", "config")}
    outcome = None
    if detail.outcome is not None:
        outcome = {k: v for k, v in detail.outcome.items() if k in Outcome.__dataclass_fields__}
    fingerprint = detail.snapshots[0]["fingerprint"] if detail.snapshots else {}
    config = dict(run["config"])
    label = " ".join([run["command"], workload["kind"],
                      json.dumps(workload["params"], sort_keys=True),
                      json.dumps({k: v for k, v in config.items()
                                  if k not in ("revision", "placement", "argv_options")},
                                 sort_keys=True)])
    return Template(
        command=run["command"], kind=workload["kind"], config=config,
        axes={k: run[k] for k in AXES}, figures={k: run[k] for k in FIGURES},
        doc=json.loads(run["raw_json"]),
        timings=[(t.token, t.ms, t.attn_ms) for t in detail.token_timings],
        outcome=outcome, workload=workload, model=model,
        schema=str(fingerprint.get("schema", "benchfarm.fingerprint/3")), label=label)


# -- boards ----------------------------------------------------------------------------------


# The limits the templates' machine (the seed's) is credited with: above what a real run on it
# can imply (Zen 5: two 512-bit FMA pipes at ~3.5 GHz; memory and cache read GB/s by buffer
# MiB), so that no grown figure is beyond its board's roofline. A board's limits are these over
# its speed, as its timings are the templates' times its speed (``Board.limits``).
SEED_FMA_GFLOPS = 230.0
SEED_READ_GBPS_BY_MIB = {1: 400.0, 4: 250.0, 16: 120.0, 128: 70.0}


@dataclass(frozen=True)
class BoardClass:
    name: str
    arch: str
    share: float  # of the boards
    speed: float  # its timings against the seed's (this machine's)
    overhead_ms: float  # push, exec and fetch over its transport
    kernels: tuple[str, ...]
    cpu_model: str | None
    cpu_id: str
    cores: tuple[tuple[str | None, int], ...]  # (part, max kHz) per core
    big_max_khz: tuple[int, ...]  # what the fastest cores top out at, board to board
    thermal: tuple[tuple[str, float], ...]  # zone type, idle temperature
    devfreq: tuple[tuple[str, str, tuple[int, ...]], ...]  # device, governor, offered Hz
    mem_kb: tuple[int, ...]
    threads: int


CLASSES = (
    BoardClass("rk3588", "aarch64", 0.40, 2.8, 260.0,
               ("6.1.75-rockchip-rk3588", "6.1.84-rockchip-rk3588"), None,
               "implementer 0x41 variant 0x2,0x4 part 0xd05,0xd0b",
               (("0xd05", 1800000),) * 4 + (("0xd0b", 2400000),) * 4,
               (2256000, 2304000, 2400000),
               (("soc-thermal", 44.0), ("bigcore0-thermal", 45.0), ("bigcore1-thermal", 45.0),
                ("littlecore-thermal", 43.0), ("center-thermal", 43.0), ("gpu-thermal", 42.0),
                ("npu-thermal", 42.0)),
               (("dmc", "dmc_ondemand", (528000000, 1068000000, 1560000000, 2112000000)),
                ("fb000000.gpu", "simple_ondemand", (300000000, 600000000, 1000000000)),
                ("fdab0000.npu", "rknpu_ondemand", (300000000, 700000000, 1000000000))),
               (16337876, 8020236), 4),
    BoardClass("rpi5", "aarch64", 0.24, 2.4, 210.0, ("6.6.51+rpt-rpi-2712",), None,
               "implementer 0x41 variant 0x4 part 0xd0b", (("0xd0b", 2400000),) * 4,
               (2400000,), (("cpu-thermal", 48.0),), (), (8245360, 4045360), 4),
    BoardClass("orin", "aarch64", 0.16, 2.2, 230.0, ("5.15.136-tegra",), None,
               "implementer 0x41 variant 0x1 part 0xd42", (("0xd42", 1510400),) * 6,
               (1510400, 1728000),
               (("cpu-thermal", 40.0), ("gpu-thermal", 39.0), ("cv0-thermal", 39.0),
                ("soc0-thermal", 40.0), ("tj-thermal", 41.0)),
               (("17000000.gpu", "nvhost_podgov", (306000000, 510000000, 624750000)),),
               (7620184,), 6),
    BoardClass("x86", "x86_64", 0.20, 1.1, 120.0, ("6.1.0-26-amd64", "6.1.0-28-amd64"),
               "Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz",
               "vendor GenuineIntel family 6 model 106 stepping 6", ((None, 3400000),) * 16,
               (3400000,), (("x86_pkg_temp", 38.0),), (), (65598312, 131592312), 8),
)


@dataclass
class Board:
    name: str
    cls: BoardClass
    speed: float
    kernel: str
    big_khz: int
    governor: str  # a few boards were left on schedutil
    hot: float  # how much warmer than its class this board runs
    load: float  # its usual 1-minute load
    mem_kb: int
    dmc_low: bool  # a bootloader without DMC DVFS: the memory clock stays low
    host: str
    device_id: int = 0

    def fingerprint(self, rng: random.Random, phase: str, at: datetime, throttled: bool,
                    loaded: bool, schema: str) -> dict[str, Any]:
        after = phase == "after"
        load1 = (3.0 + rng.random() * 3) if loaded else self.load * (0.5 + rng.random())
        if after:
            load1 += 0.6
        loadavg = [round(load1, 2), round(load1 * 0.8 + 0.05, 2), round(load1 * 0.6 + 0.05, 2)]
        warm = (6.0 if after else 0.0) + self.hot + rng.gauss(0, 1.0)
        cores = []
        for cpu, (part, max_khz) in enumerate(self.cls.cores):
            top = self.big_khz if max_khz == self.cls.cores[-1][1] else max_khz
            cur = top if self.governor == "performance" else rng.choice((top // 2, top))
            if throttled:
                cur = int(top * 0.75)
            cores.append({"cpu": cpu, "online": True, "max_khz": top, "policy_max_khz": top,
                          "cur_khz": cur, "governor": self.governor, "part": part})
        thermal = [{"zone": f"thermal_zone{i}", "type": kind,
                    "temp_c": round(base + warm + (45.0 if throttled else 0.0), 1)}
                   for i, (kind, base) in enumerate(self.cls.thermal)]
        devfreq = []
        for device, governor, offered in self.cls.devfreq:
            cur = offered[0] if (self.dmc_low and device == "dmc") else offered[-1]
            devfreq.append({"device": device, "governor": governor, "cur_hz": cur,
                            "min_hz": offered[0], "max_hz": offered[-1],
                            "available_hz": list(offered)})
        available = int(self.mem_kb * (0.80 + 0.15 * rng.random()))
        doc = {"arch": self.cls.arch, "kernel": self.kernel, "loadavg": loadavg,
               "mem_total_kb": self.mem_kb, "mem_available_kb": available,
               "cpu_model": self.cls.cpu_model, "cores": cores, "thermal": thermal,
               "devfreq": devfreq, "cpu_id": self.cls.cpu_id, "schema": schema,
               "device": self.name, "target_arch": self.cls.arch, "emulated": False,
               "taken_at": round((at - datetime(1970, 1, 1)).total_seconds(), 6)}
        doc["flags"] = snapshot_flags(doc, phase)
        return doc

    def limits(self) -> list[dict[str, Any]]:
        """Its health check's limit items (``harness.lab.health``'s, ``db.limits``' keys)."""
        curve = {str(mib): gbps / self.speed for mib, gbps in SEED_READ_GBPS_BY_MIB.items()}
        memory = curve[str(max(SEED_READ_GBPS_BY_MIB))]
        return [{"name": "memory read", "ok": True, "detail": f"{memory:.2f} GB/s read from "
                 "memory", "key": READ_GBPS, "value": memory, READ_CURVE: curve},
                {"name": "fma peak", "ok": True,
                 "detail": f"{SEED_FMA_GFLOPS / self.speed:.2f} GFLOP/s per core",
                 "key": FMA_GFLOPS, "value": SEED_FMA_GFLOPS / self.speed}]

    def info(self) -> dict[str, Any]:
        """The inventory entry, as the store keeps it."""
        workdir = "/var/tmp/benchfarm" if self.cls.arch == "x86_64" else "/home/bench/benchfarm"
        big = [i for i, (_, khz) in enumerate(self.cls.cores) if khz == self.cls.cores[-1][1]]
        return {"address": self.host, "user": "bench", "port": 22, "cpus": big,
                "threads": self.cls.threads, "workdir": workdir, "exec_prefix": []}


def make_boards(plan: Plan, seed: int) -> list[Board]:
    rng = random.Random(f"{seed}:boards")
    boards = []
    counts = [max(1, round(plan.boards * c.share)) for c in CLASSES]
    counts[0] += plan.boards - sum(counts)
    for c, (cls, count) in enumerate(zip(CLASSES, counts, strict=True)):
        for i in range(count):
            boards.append(Board(
                name=f"{cls.name}-{i + 1:02d}", cls=cls,
                speed=cls.speed * math.exp(rng.gauss(0, 0.04)), kernel=rng.choice(cls.kernels),
                big_khz=rng.choice(cls.big_max_khz),
                governor="schedutil" if rng.random() < 0.06 else "performance",
                hot=rng.uniform(-3, 8), load=rng.uniform(0.02, 0.4),
                mem_kb=rng.choice(cls.mem_kb),
                dmc_low=any(d[0] == "dmc" for d in cls.devfreq) and rng.random() < 0.1,
                host=f"10.0.{c}.{20 + i}"))
    return boards


def inventory_toml(boards: list[Board]) -> str:
    """An inventory of the boards (for `benchfarm devices list --inventory`)."""
    lines = ["# bench/scale.py's boards (none of them reachable: for reading the store)"]
    for board in boards:
        info = board.info()
        lines += ["", "[[device]]", f'name = "{board.name}"', f'host = "{board.host}"',
                  'user = "bench"', f'arch = "{board.cls.arch}"', f'class = "{board.cls.name}"',
                  f"cpus = {info['cpus']}", f"threads = {info['threads']}",
                  f'workdir = "{info["workdir"]}"']
    return "\n".join(lines) + "\n"


# -- engine revisions ------------------------------------------------------------------------


def revision_name(seed: int, index: int) -> str:
    """40 hex digits, the first four counting: sorted order is the order in time."""
    return f"{index:04x}" + hashlib.sha1(f"{seed}:rev:{index}".encode()).hexdigest()[:36]


def build_record(seed: int, index: int, revision: str, arch: str) -> dict[str, Any]:
    source = hashlib.sha256(f"{seed}:src:{index}".encode()).hexdigest()
    key = source[:16]
    cross = arch != "x86_64"
    march = "-march=armv8.2-a+dotprod" if cross else "-march=x86-64-v3"
    return {
        "engine": "lmc", "target": arch, "variant": "release", "toolchain": "gcc",
        "compiler": "aarch64-linux-gnu-gcc" if cross else "gcc",
        "compiler_version": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0",
        "cflags": ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter",
                   "-O3", "-fno-math-errno", march, "-mtune=generic"],
        "ldflags": ["-lm", "-lpthread"], "source_hash": source, "revision": revision,
        "build_key": key, "binary": f"/var/cache/benchfarm/engine/{arch}-release-{key}/lmc",
        "binary_sha256": hashlib.sha256(f"{seed}:bin:{index}:{arch}".encode()).hexdigest(),
        "build_seconds": round(4.0 + (index % 7) * 0.3 + (9.0 if cross else 0.0), 3),
        "extra": {}}


# -- one run's attempts ----------------------------------------------------------------------


def attempt_statuses(rng: random.Random) -> list[str]:
    """A run's attempts, oldest first: most are ok at once; board losses and failures are
    retried; some fail for good, wait as pending, or were interrupted or cancelled."""
    u = rng.random()
    for bound, statuses in ((0.900, ["ok"]), (0.945, ["lost", "ok"]), (0.965, ["failed", "ok"]),
                            (0.975, ["lost", "failed", "ok"]), (0.985, ["failed"]),
                            (0.990, ["lost", "lost", "pending"]), (0.996, ["interrupted", "ok"]),
                            (0.998, ["cancelled"])):
        if u < bound:
            return list(statuses)
    return ["lost", "ok"]


@dataclass
class Cell:
    """A run of the matrix: what to replay, where, at which revision."""

    key: str
    experiment_id: int
    template: Template
    board: Board
    threads: int
    build_id: int
    revision: str
    level: float  # the engine's speed at this revision (the nightly's planted steps)
    repeat: int
    statuses: list[str]


class Writer:
    """Makes the RunResults of a cell (one per attempt) from its template."""

    def __init__(self, ids: dict[str, Any], seed: int) -> None:
        self.ids = ids  # model and workload ids by the template's label
        self.seed = seed

    def results(self, cell: Cell, rng: random.Random, start: float) -> tuple[list[RunResult],
                                                                              float]:
        """The cell's attempts from ``start`` (seconds into the year); returns them and when
        the last one ended."""
        out = []
        moment = start
        for attempt, status in enumerate(cell.statuses):
            result = self._attempt(cell, rng, status, moment, attempt)
            out.append(result)
            took = (result.wall_ms or 1000.0) / 1000.0
            moment += took + (rng.uniform(30, 120) if status in ("lost", "failed")
                              else rng.uniform(0.5, 2.0))
        return out, moment

    def _attempt(self, cell: Cell, rng: random.Random, status: str, at: float,
                 attempt: int) -> RunResult:
        t, board = cell.template, cell.board
        started = YEAR_START + timedelta(seconds=at)
        config = copy.deepcopy(t.config)
        if "threads" in config:
            config["threads"] = cell.threads
        config["revision"] = cell.revision
        config["placement"] = board.name
        argv = config.get("argv_options")
        if isinstance(argv, list) and "--threads" in argv:
            argv[argv.index("--threads") + 1] = str(cell.threads)
        axes = dict(t.axes)
        if axes.get("threads") is not None:
            axes["threads"] = cell.threads
        base = RunResult(
            run_key=cell.key, experiment_id=cell.experiment_id, device_id=board.device_id,
            command=t.command, status=status, build_id=cell.build_id,
            model_id=self.ids["model"].get(t.label), workload_id=self.ids["workload"][t.label],
            config=config, repeat=cell.repeat, started_at=started, **axes)
        if status == "running":
            return base
        if status != "ok":
            return self._unfinished(base, board, rng, status, started, t.schema)
        throttled = rng.random() < 0.006
        loaded = rng.random() < 0.015
        threads_factor = 1.0 / (max(cell.threads, 1) ** 0.6)
        speed = board.speed * threads_factor * (1.18 if throttled else 1.0) * (
            1.06 if loaded else 1.0)
        prefill = speed * math.exp(rng.gauss(0, 0.02))
        decode = speed * cell.level * math.exp(rng.gauss(0, 0.02))
        figures = t.figures
        engine_ms = (figures["engine_ms"] or 100.0) * (prefill + decode) / 2
        overhead = board.cls.overhead_ms * math.exp(rng.gauss(0, 0.2))
        wall_ms = engine_ms + overhead
        finished = started + timedelta(milliseconds=wall_ms)
        doc = _scaled_doc(t, prefill, decode, cell.threads, rng)
        timings = [TokenTiming(step=i, token=token, ms=round(ms * decode * _jitter(rng), 4),
                               attn_ms=None if attn is None else round(attn * decode
                                                                       * _jitter(rng), 4))
                   for i, (token, ms, attn) in enumerate(t.timings)]
        outcome = None
        if t.outcome is not None:
            values = dict(t.outcome)
            if values.get("attn_median_ms") is not None:
                values["attn_median_ms"] = doc.get("ms", values["attn_median_ms"])
            outcome = Outcome(**copy.deepcopy(values))
        before = board.fingerprint(rng, "before", started, throttled, loaded, t.schema)
        after = board.fingerprint(rng, "after", finished, throttled, False, t.schema)
        base.exit_code = 0
        base.finished_at = finished
        base.wall_ms = round(wall_ms, 3)
        base.engine_ms = round(engine_ms, 3)
        base.overhead_ms = round(overhead, 3)
        base.prefill_ms = _times(figures["prefill_ms"], prefill)
        base.decode_ms_per_token = _times(figures["decode_ms_per_token"], decode)
        base.attn_ms_per_token = _times(figures["attn_ms_per_token"], decode)
        base.prompt_tokens = figures["prompt_tokens"]
        base.raw_json = json.dumps(doc)
        base.token_timings = timings
        base.outcome = outcome
        base.snapshots = [Snapshot("before", before, started), Snapshot("after", after, finished)]
        return base

    def _unfinished(self, base: RunResult, board: Board, rng: random.Random, status: str,
                    started: datetime, schema: str) -> RunResult:
        if status == "failed":
            base.exit_code = 1
            base.error = rng.choice(FAILURES).format(host=board.host)
            took = rng.uniform(50, 900_000 if "timed out" in base.error else 3_000)
            base.wall_ms = round(took, 3)
            base.finished_at = started + timedelta(milliseconds=took)
            before = board.fingerprint(rng, "before", started, False, False, schema)
            base.snapshots = [Snapshot("before", before, started)]
        elif status == "lost":
            base.error = LOST_ERROR
            base.finished_at = started + timedelta(seconds=rng.uniform(60, 600))
        elif status == "pending":
            base.error = (f"no board of class {board.cls.name} could take it: {board.name} "
                          "was lost 3 times")
            base.finished_at = started
        elif status == "interrupted":
            base.error = "the coordinator was stopped (SIGTERM) while it was in flight"
            base.finished_at = started + timedelta(seconds=rng.uniform(1, 30))
        else:  # cancelled
            base.error = "cancelled by `benchfarm cancel` (alice)"
            base.finished_at = started + timedelta(seconds=rng.uniform(1, 30))
        return base


def _jitter(rng: random.Random) -> float:
    return 1.0 + rng.gauss(0, 0.01)


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 4)


def _scaled_doc(t: Template, prefill: float, decode: float, threads: int,
                rng: random.Random) -> dict[str, Any]:
    """The template's engine output with its timings scaled (prefill by ``prefill``, decode
    and attention by ``decode``) and its thread count set."""
    doc = copy.deepcopy(t.doc)
    config = doc.get("config")
    if isinstance(config, dict) and "threads" in config:
        config["threads"] = threads
    if t.command == "generate":
        for key in ("prefill_ms",):
            if isinstance(doc.get(key), int | float):
                doc[key] = round(doc[key] * prefill, 4)
        for key in ("decode_ms_per_token", "attn_ms_per_token"):
            if isinstance(doc.get(key), int | float):
                doc[key] = round(doc[key] * decode, 4)
        for step in doc.get("steps") or []:
            for key in ("ms", "attn_ms"):
                if isinstance(step.get(key), int | float):
                    step[key] = round(step[key] * decode * _jitter(rng), 4)
    else:  # ppl (all prefill) and attn-bench (attention alone): "ms", and attn-bench's "runs"
        factor = prefill if t.command == "ppl" else decode
        if isinstance(doc.get("ms"), int | float):
            doc["ms"] = round(doc["ms"] * factor, 5)
        if isinstance(doc.get("runs"), list):
            doc["runs"] = [round(x * factor * _jitter(rng), 5) for x in doc["runs"]]
    return doc


# -- the experiments -------------------------------------------------------------------------


@dataclass
class Experiment:
    name: str
    start: float  # seconds into the year
    cells: Callable[[], Iterator[Cell]]  # its runs in the order they ran
    spec_text: str
    boards: list[Board]
    runs: int
    measurements: int
    revisions: list[str]
    jobs: int = 1
    id: int = 0
    keys: list[str] = field(default_factory=list)


def run_key(seed: int, experiment: str, index: int) -> str:
    return hashlib.sha256(f"{seed}:{experiment}:{index}".encode()).hexdigest()


class Grower:
    """Plans the experiments and writes them (``grow``)."""

    def __init__(self, store: Store, templates: list[Template], plan: Plan, seed: int,
                 progress: Callable[[str], None] | None = None) -> None:
        if not templates:
            raise ValueError("no templates: the seed stores hold no ok run with raw output")
        self.store, self.templates, self.plan, self.seed = store, templates, plan, seed
        self.progress = progress or (lambda line: None)
        self.boards = make_boards(plan, seed)
        self.by_kind: dict[str, list[Template]] = {}
        for t in templates:
            self.by_kind.setdefault(t.kind, []).append(t)
        self.revisions = [revision_name(seed, r) for r in range(plan.revisions)]
        self.manifest = Manifest(plan=asdict(plan), seed=seed, revisions=self.revisions)
        self.counts = {"experiments": 0, "runs": 0, "measurements": 0, "token_timings": 0,
                       "snapshots": 0, "outcomes": 0, "jobs": 0, "builds": 0, "boards": 0,
                       "workloads": 0, "links": 0}

    # reference rows
    def _references(self) -> None:
        store = self.store
        for board in self.boards:
            board.device_id = store.upsert_device(board.name, board.cls.arch, board.cls.name,
                                                  False, board.info())
        self.counts["boards"] = len(self.boards)
        self.builds: dict[tuple[int, str], int] = {}
        for index, revision in enumerate(self.revisions):
            for arch in sorted({b.cls.arch for b in self.boards}):
                self.builds[index, arch] = store.record_build(
                    build_record(self.seed, index, revision, arch))
        self.counts["builds"] = len(self.builds)
        models: dict[tuple[str, str], int] = {}
        ids: dict[str, Any] = {"model": {}, "workload": {}}
        for t in self.templates:
            if t.model is not None:
                mkey = (t.model["path"], t.model["sha256"])
                if mkey not in models:
                    models[mkey] = store.upsert_model(t.model["path"], t.model["sha256"],
                                                      t.model["config"])
                ids["model"][t.label] = models[mkey]
            w = t.workload
            ids["workload"][t.label] = store.upsert_workload(
                w["kind"], w["params"], w["content_hash"], w["ids"], w["answer"],
                w["needle_span"])
        self.counts["workloads"] = len({w for w in ids["workload"].values()})
        self.writer = Writer(ids, self.seed)

    def _level(self, index: int) -> float:
        """The engine's speed at a revision for runs other than the nightly's: a slow drift
        (the year's work made decoding about 10 % faster)."""
        return 1.0 - 0.1 * index / max(1, self.plan.revisions - 1)

    def _revision_at(self, moment: float) -> int:
        return min(self.plan.revisions - 1, int(moment / YEAR_S * self.plan.revisions))

    # the experiments
    def _plan_experiments(self) -> list[Experiment]:
        plan, rng = self.plan, random.Random(f"{self.seed}:experiments")
        nightly, series, planted = self._nightly()
        exp1k = self._exp_1k()
        fixed = nightly.measurements + exp1k.measurements
        others = plan.experiments - 2
        budget = plan.measurements - fixed
        if budget < others:
            raise ValueError(f"a plan of {plan.measurements} measurements cannot hold the "
                             f"nightly and {EXP_1K} ({fixed} measurements) and {others} more "
                             "experiments")
        weights = [math.exp(rng.gauss(0, 1.0)) for _ in range(others)]
        total = sum(weights)
        sizes = [max(1, int(budget * w / total)) for w in weights]
        sizes[-1] += budget - sum(sizes)
        while sizes[-1] < 1:  # the rounding took it all: give the last one from the largest
            biggest = sizes.index(max(sizes))
            sizes[biggest] -= 1
            sizes[-1] += 1
        starts = sorted(rng.uniform(0, YEAR_S * 0.98) for _ in range(others))
        starts[-1] = YEAR_S * 0.99  # the newest, still running, comes last
        general = [self._general(i, measurements, start, last=i == others - 1)
                   for i, (measurements, start) in enumerate(zip(sizes, starts, strict=True))]
        self.manifest.planted = planted
        self.series = series
        return [nightly, exp1k, *general]

    def _nightly(self) -> tuple[Experiment, list[dict[str, Any]], list[dict[str, Any]]]:
        plan, seed = self.plan, self.seed
        rng = random.Random(f"{seed}:{NIGHTLY}")
        generate = [t for t in self.templates if t.command == "generate"] or self.templates
        # decode first, then needle: the nightly's workload points
        generate.sort(key=lambda t: (t.kind != "decode", t.label))
        choices = [(t, threads) for threads in (4, 1, 2, 8, 3, 6) for t in generate]
        configs = choices[:plan.configs]
        nightly_boards = [next((b for b in self.boards if b.cls.arch == arch), self.boards[0])
                          for arch in ("aarch64", "x86_64")]
        series = [{"series": i, "device": nightly_boards[i % 2].name, "template": t.label,
                   "threads": threads, "kind": t.kind, "params": t.workload["params"],
                   "policy": t.axes.get("policy"), "k": t.axes.get("k")}
                  for i, (t, threads) in enumerate(configs)]
        steps: dict[int, list[tuple[int, float]]] = {}
        planted = []
        for index, where, factor in STEP_PLAN:
            s = index % len(configs)
            at = min(plan.revisions - 1, max(1, round(where * plan.revisions)))
            if any(at == a for a, _ in steps.get(s, [])):
                continue
            steps.setdefault(s, []).append((at, factor))
            planted.append({**{k: v for k, v in series[s].items() if k != "template"},
                            "revision_index": at, "revision": self.revisions[at],
                            "factor": factor, "metric": "decode_ms_per_token"})
        statuses = [[attempt_statuses(rng) for _ in configs] for _ in range(plan.revisions)]
        measurements = sum(len(s) for rev in statuses for s in rev)

        def level(s: int, r: int) -> float:
            factor = 1.0
            for at, f in steps.get(s, []):
                if r >= at:
                    factor *= f
            return factor

        def cells() -> Iterator[Cell]:
            for r in range(plan.revisions):
                for s, (t, threads) in enumerate(configs):
                    board = nightly_boards[s % 2]
                    yield Cell(run_key(seed, NIGHTLY, r * len(configs) + s), nightly.id, t, board,
                               threads, self.builds[r, board.cls.arch], self.revisions[r],
                               level(s, r), 0, statuses[r][s])

        text = _spec_text(NIGHTLY, "every engine revision: decode and needle latency, "
                          f"{len(configs)} configs", configs, nightly_boards,
                          "the revision under test (benchfarm track)")
        nightly = Experiment(NIGHTLY, 0.0, cells, text, nightly_boards,
                             plan.revisions * len(configs), measurements, self.revisions,
                             jobs=plan.revisions)
        nightly.keys = [run_key(seed, NIGHTLY, i) for i in range(nightly.runs)]
        nightly.start = YEAR_S / plan.revisions * 0.5  # each revision's runs: see _timeline
        return nightly, series, planted

    def _exp_1k(self) -> Experiment:
        plan, seed = self.plan, self.seed
        rng = random.Random(f"{seed}:{EXP_1K}")
        templates = self.by_kind.get("needle") or self.templates
        rk = [b for b in self.boards if b.cls is CLASSES[0]]
        boards = rk[2:4] if len(rk) >= 4 else rk[:2] if len(rk) >= 2 else self.boards[:2]
        self.manifest.compare_boards = [b.name for b in boards]
        statuses = [attempt_statuses(rng) for _ in range(plan.exp_runs)]
        start = YEAR_S * 0.8
        revision = self._revision_at(start)

        def cells() -> Iterator[Cell]:
            n = 0
            repeat = 0
            while True:
                for t in templates:
                    for board in boards:
                        if n == plan.exp_runs:
                            return
                        yield Cell(run_key(seed, EXP_1K, n), exp.id, t, board, 1,
                                   self.builds[revision, board.cls.arch],
                                   self.revisions[revision], self._level(revision), repeat,
                                   statuses[n])
                        n += 1
                repeat += 1

        text = _spec_text(EXP_1K, "needle recall and decode speed on two RK3588 boards, "
                          "repeated", [(t, 1) for t in templates], boards,
                          self.revisions[revision])
        exp = Experiment(EXP_1K, start, cells, text, boards, plan.exp_runs,
                         sum(len(s) for s in statuses), [self.revisions[revision]])
        exp.keys = [run_key(seed, EXP_1K, i) for i in range(plan.exp_runs)]
        return exp

    def _general(self, index: int, measurements: int, start: float, last: bool) -> Experiment:
        seed = self.seed
        rng = random.Random(f"{seed}:general:{index}")
        kinds = [k for k in KINDS if k in self.by_kind]
        kind = rng.choices(kinds + ["mixed"], weights=[4, 3, 2, 1][:len(kinds)] + [1])[0]
        templates = self.templates if kind == "mixed" else self.by_kind[kind]
        if len(templates) > 12 and rng.random() < 0.5:  # a part of the matrix
            templates = sorted(rng.sample(templates, rng.randint(6, len(templates))),
                               key=lambda t: t.label)
        cls = rng.choices(CLASSES, weights=[c.share for c in CLASSES])[0]
        pool = [b for b in self.boards if b.cls is cls] or self.boards
        boards = sorted(rng.sample(pool, min(len(pool), rng.choice((1, 1, 2, 2, 3, 4)))),
                        key=lambda b: b.name)
        threads = rng.choice((1, cls.threads, cls.threads))
        now = self._revision_at(start)
        revisions = [now]
        if now > 0 and rng.random() < 0.2:  # an A/B of the engine against an older revision
            revisions = [rng.randrange(0, now), now]
        name = f"{kind}-{rng.choice(TOPICS[kind])}-{index + 1:03d}"
        # attempts until the measurements are used up (the last run may lose some)
        statuses: list[list[str]] = []
        left = measurements
        while left > 0:
            s = attempt_statuses(rng)[:left]
            statuses.append(s)
            left -= len(s)
        if last:  # the newest experiment is still running: its last runs are in flight
            for s in statuses[-min(len(boards), 3, len(statuses)):]:
                s[-1] = "running"
        runs = len(statuses)

        def cells() -> Iterator[Cell]:
            n, repeat = 0, 0
            while True:
                for r in revisions:
                    for board in boards:
                        for t in templates:
                            if n == runs:
                                return
                            yield Cell(run_key(seed, name, n), exp.id, t, board, threads,
                                       self.builds[r, board.cls.arch], self.revisions[r],
                                       self._level(r), repeat, statuses[n])
                            n += 1
                repeat += 1

        text = _spec_text(name, f"{kind} on {cls.name}", [(t, threads) for t in templates],
                          boards, " vs ".join(self.revisions[r][:12] for r in revisions))
        exp = Experiment(name, start, cells, text, boards, runs, measurements,
                         [self.revisions[r] for r in revisions])
        exp.keys = [run_key(seed, name, i) for i in range(runs)]
        return exp

    # writing
    def grow(self, batch: int = 256) -> Manifest:
        started, cpu = time.perf_counter(), time.process_time()
        self._references()
        experiments = self._plan_experiments()
        for exp in experiments:
            exp.id = self.store.upsert_experiment(
                exp.name, exp.spec_text, hashlib.sha256(exp.spec_text.encode()).hexdigest())
        self.counts["experiments"] = len(experiments)
        pending: list[RunResult] = []
        running: list[RunResult] = []
        last_note = time.perf_counter()
        for results in heapq.merge(*(self._timeline(e) for e in experiments),
                                   key=lambda item: item[0]):
            for result in results[1]:
                self._count(result)
                (running if result.status == "running" else pending).append(result)
            if len(pending) >= batch:
                self._write(pending)
                pending = []
                if time.perf_counter() - last_note > 15:
                    last_note = time.perf_counter()
                    done = self.counts["measurements"]
                    rate = done / (last_note - started)
                    self.progress(f"grow: {done:,} of {self.plan.measurements:,} measurements "
                                  f"({rate:,.0f}/s)")
        self._write(pending)
        self._in_flight(running, experiments[-1])
        self._links(experiments)
        self._jobs(experiments)
        self._boards()
        for exp in experiments[:-1]:  # as each job's end keeps it; the newest is in flight
            keep_baseline_of(self.store, exp.name)
        exp1k = experiments[1]
        self.manifest.sample_run = self._sample_run(exp1k)
        self.manifest.counts = dict(self.counts)
        self.manifest.seconds = time.perf_counter() - started
        self.manifest.cpu_seconds = time.process_time() - cpu
        return self.manifest

    def _write(self, results: list[RunResult]) -> None:
        start = time.perf_counter()
        write_results(self.store, results)
        self.manifest.write_seconds += time.perf_counter() - start

    def _timeline(self, exp: Experiment) -> Iterator[tuple[float, list[RunResult]]]:
        """The experiment's runs as (start, attempts), in the order of their start."""
        rng = random.Random(f"{self.seed}:timeline:{exp.name}")
        moment = exp.start
        per_revision = len(self.series) if exp.name == NIGHTLY else 0
        for n, cell in enumerate(exp.cells()):
            self.counts["runs"] += 1
            if per_revision and n % per_revision == 0:  # each revision's night
                moment = max(moment, (n // per_revision + 0.5) * YEAR_S / self.plan.revisions)
            results, end = self.writer.results(cell, rng, moment)
            yield moment, results
            moment = end

    def _count(self, result: RunResult) -> None:
        c = self.counts
        c["measurements"] += 1
        c["token_timings"] += len(result.token_timings)
        c["snapshots"] += len(result.snapshots)
        c["outcomes"] += result.outcome is not None

    def _in_flight(self, running: list[RunResult], newest: Experiment) -> None:
        """The attempts still running: started under a live lease of their board."""
        leased: set[int] = set()
        for result in running:
            lease_id = None
            board = next(b for b in self.boards if b.device_id == result.device_id)
            if board.device_id not in leased:
                claim = self.store.leases.acquire(board.name, "scale-bench:coordinator",
                                                  ttl_s=10 * YEAR_S, experiment=newest.name,
                                                  run_key=result.run_key)
                if claim.granted is not None:
                    lease_id = claim.granted.lease_id
                    leased.add(board.device_id)
            result.lease_id = lease_id
            self.store.start_measurement(result)

    def _links(self, experiments: list[Experiment]) -> None:
        """A few experiments also hold some runs an earlier one stored (run keys do not name
        the experiment: a rerun reuses what is done)."""
        rng = random.Random(f"{self.seed}:links")
        general = experiments[2:]
        for i, exp in enumerate(general):
            if i == 0 or rng.random() >= 0.05:
                continue
            earlier = general[rng.randrange(0, i)]
            keys = rng.sample(earlier.keys, min(len(earlier.keys), rng.randint(10, 100)))
            self.store.link_runs(exp.id, keys)
            self.counts["links"] += len(keys)

    def _jobs(self, experiments: list[Experiment]) -> None:
        jobs = self.store.jobs
        rng = random.Random(f"{self.seed}:jobs")
        order = sorted(experiments[2:] + [experiments[1]], key=lambda e: e.start)
        holder = "vm:4242:5ca1ab1e"
        nightly = experiments[0]
        for r in range(self.plan.revisions):
            job = jobs.add(NIGHTLY, "specs/nightly.toml", nightly.spec_text, owner="track",
                           holder=holder)
            jobs.set_totals(job, {b.name: len(self.series) // 2 for b in nightly.boards})
            jobs.finish(job, "done", f"revision {self.revisions[r][:12]}: "
                        f"{len(self.series)} runs")
            self.counts["jobs"] += 1
        for n, exp in enumerate(order):
            per_board = {b.name: exp.runs // len(exp.boards) for b in exp.boards}
            owner = rng.choice(("alice", "bob", "chen", "dara", "emil"))
            if rng.random() < 0.08:  # a first try that failed (a spec error, a lost node)
                job = jobs.add(exp.name, f"specs/{exp.name}.toml", exp.spec_text, owner=owner,
                               holder=holder)
                jobs.finish(job, "failed", "the coordinator lost its Ray head node")
                self.counts["jobs"] += 1
            job = jobs.add(exp.name, f"specs/{exp.name}.toml", exp.spec_text, owner=owner,
                           holder=holder)
            jobs.set_totals(job, per_board)
            self.counts["jobs"] += 1
            if n == len(order) - 1:
                self.manifest.sample_job = job
                break  # the newest is running
            jobs.finish(job, "done", f"experiment {exp.name}: {exp.runs} runs in the matrix")
            self.manifest.sample_job = job
        queued = order[len(order) // 2]
        jobs.add(queued.name, f"specs/{queued.name}.toml", queued.spec_text, owner="alice",
                 priority=1)
        self.counts["jobs"] += 1

    def _boards(self) -> None:
        boards = self.store.boards
        rng = random.Random(f"{self.seed}:health")
        for board in self.boards:
            for _ in range(3):
                ok = rng.random() > 0.03
                items = [{"name": "reachable", "ok": True, "detail": board.host},
                         {"name": "arch", "ok": True, "detail": f"{board.cls.arch}"},
                         {"name": "free disk", "ok": ok,
                          "detail": f"{rng.randint(800, 40000) if ok else 120} MB free in "
                                    f"{board.info()['workdir']}"},
                         {"name": "lmc", "ok": True, "detail": "lmc info ok, push cached"},
                         *board.limits()]
                boards.record_health(board.name, ok, items, "scale-bench")
        for board, state, reason in ((self.boards[5], "maintenance", "reflashing the SD card"),
                                     (self.boards[-3], "retired", "fan failed")):
            boards.set_state(board.name, state, reason, "alice")
        boards.reserve(self.boards[1].name, "bob", datetime.now(UTC) + timedelta(days=30),
                       "a week of thermal runs")

    def _sample_run(self, exp: Experiment) -> str:
        for cell in exp.cells():
            if cell.template.timings and cell.statuses[-1] == "ok":
                return cell.key
        return exp.keys[0]


TOPICS = {"needle": ("k-sweep", "depth-grid", "recall", "ablation"),
          "decode": ("latency", "threads", "kv-q8", "budget"),
          "ppl": ("heldout", "eviction", "kv-budget"),
          "attn-bench": ("kernel", "heads", "ctx-sweep"),
          "mixed": ("release-check", "smoke", "board-bringup")}


def _spec_text(name: str, description: str, configs: list[tuple[Template, int]],
               boards: list[Board], revision: str) -> str:
    """A spec of the experiment's shape (the store keeps the text it was run with)."""
    policies: dict[str, set[Any]] = {}
    workloads: dict[str, set[str]] = {}
    for t, _ in configs:
        policies.setdefault(str(t.axes.get("policy")), set()).add(t.axes.get("k"))
        workloads.setdefault(t.kind, set()).add(json.dumps(t.workload["params"], sort_keys=True))
    lines = [f'name = "{name}"', f'description = "{description}"',
             f"devices = {json.dumps([b.name for b in boards])}", f"# revision: {revision}",
             "repeats = 1", ""]
    for policy in sorted(policies):
        ks = sorted(k for k in policies[policy] if k is not None)
        lines.append(f"[engine.policy.{policy}]")
        if ks:
            lines.append(f"k = {ks}")
        lines.append("")
    for kind in sorted(workloads):
        lines += ["[[workload]]", f'kind = "{kind}"',
                  f"# points: {len(workloads[kind])}", ""]
    return "\n".join(lines)


def write_results(store: Store, results: list[RunResult]) -> None:
    """The one place measurements go into the store: the bulk ``Store.save_runs`` where the
    store has it, else ``save_run`` one at a time (one transaction each)."""
    if not results:
        return
    bulk = getattr(store, "save_runs", None)
    if bulk is not None:
        bulk(results)
        return
    for result in results:
        store.save_run(result)


def grow(store: Store, templates: list[Template], plan: Plan, seed: int,
         progress: Callable[[str], None] | None = None) -> Manifest:
    """Write ``plan``'s runs into ``store`` (an empty one); returns what it holds."""
    return Grower(store, templates, plan, seed, progress).grow()
