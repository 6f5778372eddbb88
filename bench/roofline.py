"""lmc decode against the memory roofline of this machine.

Decoding one token reads every weight once plus the KV cache up to the current position; at
batch size one that traffic, not arithmetic, bounds the speed. This script measures the
machine's read bandwidth with ``bench/c/stream_read.c`` (built by
``harness.engines.lmc.build``'s ninja path, all threads), runs ``lmc generate`` on the
Qwen3-0.6B-shaped bench model, and reports the achieved bandwidth = (weight bytes + KV bytes
read per token) / decode time per token, as a fraction of the measured bandwidth.

    .venv/bin/python bench/roofline.py                       # f32 and q8 weights, prompt 128
    .venv/bin/python bench/roofline.py --prompt-len 448      # decode at context 448..511

Each lmc run is bracketed by STREAM passes (its thread count and one thread) taken right
before and right after it; its fraction is taken against the best of them, and the headline
is the median of those paired fractions. The median run against the best pass of the whole
session (with at most as many threads) is printed too. ``--threads 1 2`` gives a row per
thread count.

Bytes are counted from the model's shape, the way lmc stores it: f32 weights 4 bytes, bf16 2,
q8 weights 34 bytes per 32 values (int8 + a binary16 scale), q8 KV 1 byte + one f32 scale per
32 values; the lm_head (tied: the embedding matrix) is read in full every token; norms and the
embedding row are negligible but counted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.engines.lmc import LmcAdapter, run_here
from harness.engines.lmc.build import build_c_program, build_engine
from reports.roofline import (  # noqa: F401 - the bench scripts' Shape, from here
    Shape,
    kv_bytes_per_token,
    weight_bytes_per_token,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------


def environment(lmc: Path | None = None) -> dict:
    """What a figure depends on: commit, CPU, load, governor, compiler and flags."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "n/a"

    cpu = "unknown"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()
    env = {
        "commit": commit or "unknown",
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if lmc is not None:
        info = json.loads(subprocess.run(LmcAdapter().health_argv(str(lmc)), capture_output=True,
                                         text=True, check=True).stdout)
        env.update({k: info.get(k) for k in ("version", "source_hash", "compiler", "flags",
                                             "simd")})
    return env


def finish(lmc: Path, load: tuple[tuple[float, ...], tuple[float, ...]], json_path: Path | None,
           figures: dict) -> None:
    """A bench's last lines: the load average before and after, the environment; with
    ``json_path`` every raw figure (``figures``) beside them in that file."""
    before, after = load
    print(f"loadavg before {[round(x, 2) for x in before]}, "
          f"after {[round(x, 2) for x in after]}")
    env = environment(lmc)
    print(f"environment: {json.dumps(env)}")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"environment": env, "loadavg": {
            "before": before, "after": after}, **figures}, indent=2, default=str))


@dataclass
class Bandwidth:
    threads: int
    bytes: int
    gbps_best: float
    gbps_median: float
    gbps: list[float]


def measure_bandwidth(threads: int, mib: int = 1024, passes: int = 10,
                      kernel: str = "sum") -> Bandwidth:
    """Read bandwidth over ``mib`` MiB with ``threads`` threads (best and median of passes);
    ``kernel`` "fma" streams the bytes through lmc-like FMA tiles instead of integer sums."""
    binary = build_c_program("stream_read", [BENCH_DIR / "c" / "stream_read.c"])
    out = subprocess.run([str(binary), "--mib", str(mib), "--threads", str(threads),
                          "--passes", str(passes), "--kernel", kernel],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} failed: {out.stderr.strip()}")
    doc = json.loads(out.stdout)
    return Bandwidth(doc["threads"], doc["bytes"], doc["gbps_best"], doc["gbps_median"],
                     doc["gbps"])


def stream_ceiling(threads: int, mib: int = 1024, passes: int = 10) -> list[Bandwidth]:
    """STREAM with all ``threads`` and with one: on a shared VM one thread that keeps its core
    often reads faster than two that get preempted, and the ceiling is the best either reaches."""
    counts = sorted({1, threads})
    return [measure_bandwidth(t, mib, passes) for t in counts]


# ---------------------------------------------------------------------------------------------
# Bytes per decoded token
# ---------------------------------------------------------------------------------------------


def mean_kv_bytes(shape: Shape, kv: str, prompt_len: int, steps: int) -> float:
    """Mean KV bytes over decode steps; step i attends to prompt_len + i + 1 positions."""
    return kv_bytes_per_token(shape, kv, prompt_len + (steps - 1) / 2 + 1)


def decode_bytes(shape: Shape, wq: str, kv: str, prompt_len: int, steps: int) -> float:
    """Weight + mean KV bytes one decode step reads."""
    return weight_bytes_per_token(shape, wq) + mean_kv_bytes(shape, kv, prompt_len, steps)


# ---------------------------------------------------------------------------------------------
# Running lmc
# ---------------------------------------------------------------------------------------------


def engine_binary(rev: str | None = None, isa: str | None = None) -> Path:
    """``lmc`` built from the working tree, or from git revision ``rev`` (e.g. while the
    working tree is mid-edit), for this machine at instruction-set level ``isa`` (default:
    the highest it runs)."""
    target = f"{os.uname().machine}:{isa}" if isa else None
    return Path(build_engine(target=target, rev=rev).binary)


def bench_prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    """Deterministic, varied token ids (a random model has no meaningful text anyway)."""
    return [(seed * 7919 + i * 104729 + 13) % vocab for i in range(length)]


def run_lmc_generate(lmc: Path, model_dir: Path, prompt: list[int], max_new: int, threads: int,
                     wq: str = "f32", kv: str = "f32", ctx: int | None = None,
                     timeout: float = 900, extra: tuple[str, ...] = (),
                     prefault: bool = False) -> dict:
    """One ``lmc generate`` run through the engine's adapter (``extra``: more options, e.g. the
    policy); returns its checked document. ``prefault``: the KV cache's pages written before
    the prompt (``--kv-prefault``, unless ``extra`` evicts), as llama-bench's context clears its
    KV buffer before it times anything: a timed step then pays no first touch of a page, which
    on a VM whose host takes free pages back costs from nothing to seconds of system time."""
    options = ["--max-new", str(max_new), "--threads", str(threads), "--wq", wq, "--kv", kv]
    if prefault and "--kv-budget" not in extra:
        options.append("--kv-prefault")
    if ctx is not None:
        options += ["--ctx", str(ctx)]
    return run_here(lmc, "generate", model_dir, prompt, [*options, *extra], timeout)


# ---------------------------------------------------------------------------------------------
# The bench
# ---------------------------------------------------------------------------------------------
#
# On a shared machine the bandwidth the guest gets moves by 2x from one minute to the next, so
# each engine run is bracketed by STREAM passes (with the engine's thread count and with one)
# and its fraction is taken against that ceiling: a ratio measured side by side. The old
# figure, the median run against the best pass of the whole session, is kept as the
# conservative one.


@dataclass
class PairedRun:
    wq: str
    decode_ms: float  # the run's median decode step
    attn_ms: float  # the run's median attention time per step (lmc's own clock)
    weights_ms: float  # median over steps of (step - attention): the weight products and the rest
    stream_gbps: float  # best STREAM pass just before or just after the run
    fraction: float  # achieved / stream_gbps
    weights_fraction: float  # weight bytes / weights_ms, against stream_gbps
    stream_median_gbps: float  # median of the passes beside the run with its thread count
    fraction_of_median: float  # achieved / stream_median_gbps: a median step against a median pass
    stream_own_fraction: float  # stream_median_gbps / stream_gbps: a STREAM-speed run's score


@dataclass
class RooflineRow:
    wq: str
    kv: str
    prompt_len: int
    decode: int
    threads: int
    decode_ms: list[float]  # decode_ms_per_token of each run
    attn_ms: list[float]  # attn_ms_per_token of each run
    weight_mb: float
    kv_mb: float
    achieved_gbps: float  # from the median decode time
    paired_stream_gbps: list[float]  # each run's bracketing ceiling
    paired_fractions: list[float]  # each run against its own ceiling
    fraction: float  # median of paired_fractions: the headline
    weights_fraction: float  # median of the runs' weights_fraction: the weight stream alone
    fraction_of_median: float  # median of the runs' fraction_of_median
    stream_own_fraction: float  # median of the runs' stream_own_fraction: the headline's reach
    session_stream_gbps: float  # best pass of the whole session
    fraction_of_session_best: float  # median run against session_stream_gbps


def outside_attention_ms(doc: dict) -> float:
    """The median decode step less its attention (lmc's own clock): the weight products,
    norms and the rest, whose bytes are the weights."""
    return statistics.median(s["ms"] - s["attn_ms"] for s in doc["steps"])


def paired_run(shape: Shape, wq: str, kv: str, prompt_len: int, decode: int, doc: dict,
               ceiling: list[Bandwidth]) -> PairedRun:
    """One lmc run (its ``generate`` document) against the STREAM passes around it. Besides the
    whole step, the step outside attention (lmc times attention itself) is set against the
    weight bytes alone: it says whether the weight stream or the attention falls short. The
    ceiling is the best pass (STREAM's convention); the median step is also set against the
    median pass with the run's thread count, like against like, since on a host whose
    bandwidth comes in bursts the best of many short passes catches a burst that a run of
    many steps cannot. How far: the median pass against the best is what a run reading at
    STREAM's own rate would score on the headline."""
    stream = max(b.gbps_best for b in ceiling)
    threads = doc["config"]["threads"]
    stream_median = statistics.median(g for b in ceiling if b.threads == threads for g in b.gbps)
    decode_ms = doc["decode_ms_per_token"]
    achieved = decode_bytes(shape, wq, kv, prompt_len, decode) / (decode_ms / 1e3) / 1e9
    weights_ms = outside_attention_ms(doc)
    weights_gbps = weight_bytes_per_token(shape, wq) / (weights_ms / 1e3) / 1e9
    return PairedRun(wq, decode_ms, doc["attn_ms_per_token"], weights_ms, stream,
                     round(achieved / stream, 3), round(weights_gbps / stream, 3),
                     round(stream_median, 2), round(achieved / stream_median, 3),
                     round(stream_median / stream, 3))


def roofline_row(shape: Shape, wq: str, kv: str, prompt_len: int, decode: int, threads: int,
                 runs: list[PairedRun], session_stream_gbps: float) -> RooflineRow:
    weights = weight_bytes_per_token(shape, wq)
    kv_bytes = mean_kv_bytes(shape, kv, prompt_len, decode)
    decode_ms = [r.decode_ms for r in runs]
    achieved = (weights + kv_bytes) / (statistics.median(decode_ms) / 1e3) / 1e9
    fractions = [r.fraction for r in runs]
    return RooflineRow(wq, kv, prompt_len, decode, threads, decode_ms, [r.attn_ms for r in runs],
                       round(weights / 1e6, 1), round(kv_bytes / 1e6, 1), round(achieved, 2),
                       [r.stream_gbps for r in runs], fractions,
                       round(statistics.median(fractions), 3),
                       round(statistics.median(r.weights_fraction for r in runs), 3),
                       round(statistics.median(r.fraction_of_median for r in runs), 3),
                       round(statistics.median(r.stream_own_fraction for r in runs), 3),
                       session_stream_gbps, round(achieved / session_stream_gbps, 3))


def markdown_table(rows: list[RooflineRow]) -> str:
    lines = [
        "| weights | KV | prompt | decode | threads | ms/token (median) | MB/token (w + kv) "
        "| achieved GB/s | STREAM GB/s beside each run | fraction (paired, median) "
        "| paired min-max | attention ms/token (share) | weights outside attention (paired) "
        "| against the median pass beside it | STREAM's own median pass, paired "
        "| fraction of session-best STREAM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        decode_ms, attn_ms = statistics.median(r.decode_ms), statistics.median(r.attn_ms)
        lines.append(
            f"| {r.wq} | {r.kv} | {r.prompt_len} | {r.decode} | {r.threads} "
            f"| {decode_ms:.1f} | {r.weight_mb:.0f} + {r.kv_mb:.0f} "
            f"| {r.achieved_gbps:.2f} | {statistics.median(r.paired_stream_gbps):.1f} "
            f"({min(r.paired_stream_gbps):.1f}-{max(r.paired_stream_gbps):.1f}) "
            f"| {r.fraction:.0%} | {min(r.paired_fractions):.0%}-{max(r.paired_fractions):.0%} "
            f"| {attn_ms:.2f} ({attn_ms / decode_ms:.0%}) | {r.weights_fraction:.0%} "
            f"| {r.fraction_of_median:.0%} | {r.stream_own_fraction:.0%} "
            f"| {r.fraction_of_session_best:.0%} ({r.session_stream_gbps:.1f}) |"
        )
    return "\n".join(lines)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (thread and run counts), refused with exit 2."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    from qwen3_06b import generate as generate_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="HF model dir (default: the bench model, BF16)")
    parser.add_argument("--wq", nargs="+", choices=("f32", "q8", "bf16"), default=["f32", "q8"])
    parser.add_argument("--kv", choices=("f32", "q8"), default="f32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[os.cpu_count() or 1],
                        help="engine threads; several: a row each (default: all CPUs)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="lmc runs per configuration")
    parser.add_argument("--stream-mib", type=int, default=1024)
    parser.add_argument("--stream-passes", type=int, default=5,
                        help="STREAM passes per thread count before and after each run")
    parser.add_argument("--rev", help="build lmc from this git revision (default: work tree)")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    args = parser.parse_args(argv)

    lmc = engine_binary(args.rev)
    model_dir = args.model or generate_model(dtypes=("BF16",))["BF16"]
    shape = Shape.from_model_dir(model_dir)
    env_before = environment(lmc)
    env_before["engine_rev"] = args.rev or "worktree"
    prompt = bench_prompt(args.prompt_len, shape.vocab)

    def ceiling(threads: int) -> list[Bandwidth]:
        return stream_ceiling(threads, args.stream_mib, args.stream_passes)

    configs = [(wq, t) for t in args.threads for wq in args.wq]
    bandwidths: list[Bandwidth] = []
    runs: dict[tuple[str, int], list[PairedRun]] = {c: [] for c in configs}
    for i in range(args.repeats):
        for wq, threads in configs:  # alternate configurations so drifting load hits all alike
            before = ceiling(threads)
            doc = run_lmc_generate(lmc, model_dir, prompt, args.decode, threads, wq, args.kv)
            after = ceiling(threads)
            run = paired_run(shape, wq, args.kv, args.prompt_len, args.decode, doc,
                             before + after)
            runs[wq, threads].append(run)
            bandwidths += before + after
            print(f"  repeat {i + 1}/{args.repeats} {wq} x{threads}: {run.decode_ms:.1f} ms/token, "
                  f"STREAM beside it {run.stream_gbps:.1f} GB/s, fraction {run.fraction:.0%}",
                  file=sys.stderr, flush=True)
    session_best = {t: max(b.gbps_best for b in bandwidths if b.threads <= t) for t in args.threads}
    rows = [roofline_row(shape, wq, args.kv, args.prompt_len, args.decode, t, runs[wq, t],
                         session_best[t]) for wq, t in configs]
    env_after = environment()
    print(markdown_table(rows))
    print(f"\nSTREAM read, best pass of each bracket (threads): "
          f"{', '.join(f'{b.gbps_best:.1f} ({b.threads})' for b in bandwidths)} GB/s")
    print(f"environment: {json.dumps(env_before)}\nloadavg after: {env_after['loadavg']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "environment": env_before, "loadavg_after": env_after["loadavg"],
            "model": str(model_dir), "bandwidth": [asdict(b) for b in bandwidths],
            "runs": {f"{wq} x{t}": [asdict(r) for r in rs] for (wq, t), rs in runs.items()},
            "rows": [asdict(r) for r in rows],
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
