"""lmc's weight stream beside two bare read kernels, per thread count, side by side.

The roofline (``bench/roofline.py``) sets lmc's decode against STREAM's integer sums. When a
fraction falls short, this script says where the shortfall is: in each round it measures, one
right after the other with the same thread count,

* STREAM: ``bench/c/stream_read.c``, 64-bit integer sums (the roofline's ceiling);
* a bare FMA stream: ``stream_read --kernel fma``, f32 rows packed four at a time as lmc
  packs its weights, multiplied into an L1-resident vector with FMAs and the same prefetch,
  and nothing else: the rate this host streams bytes through a matrix-vector kernel;
* lmc's weight stream: the weight bytes over the median decode step less its attention
  (``lmc generate``'s own clocks), and its whole step (weights + KV bytes over the step).

Each round's ratios are taken within the round (lmc / STREAM, lmc / FMA, FMA / STREAM) and
the medians of those ratios are reported, with the medians of each series and how each
scales from one thread to more.

    .venv/bin/python bench/weight_stream.py --wq f32 --threads 1 2 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from roofline import (
    Shape,
    bench_prompt,
    decode_bytes,
    engine_binary,
    environment,
    measure_bandwidth,
    outside_attention_ms,
    positive_int,
    run_lmc_generate,
    weight_bytes_per_token,
)


@dataclass
class Round:
    wq: str
    threads: int
    stream_gbps: float  # median pass of STREAM's integer sums
    fma_gbps: float  # median pass of the bare FMA stream
    lmc_weights_gbps: float  # weight bytes / (median step - attention)
    lmc_step_gbps: float  # (weight + KV bytes) / median step


@dataclass
class Summary:
    wq: str
    threads: int
    rounds: int
    stream_gbps: float  # medians over rounds
    fma_gbps: float
    lmc_weights_gbps: float
    lmc_step_gbps: float
    lmc_of_stream: list[float]  # median, min, max of the per-round ratios
    lmc_of_fma: list[float]
    fma_of_stream: list[float]


def measure_round(lmc: Path, model_dir: Path, shape: Shape, prompt: list[int], decode: int,
                  wq: str, threads: int, mib: int, passes: int) -> Round:
    stream = measure_bandwidth(threads, mib, passes, kernel="sum")
    fma = measure_bandwidth(threads, mib, passes, kernel="fma")
    doc = run_lmc_generate(lmc, model_dir, prompt, decode, threads, wq)
    weights_gbps = weight_bytes_per_token(shape, wq) / (outside_attention_ms(doc) / 1e3) / 1e9
    step_bytes = decode_bytes(shape, wq, "f32", len(prompt), decode)
    step_gbps = step_bytes / (doc["decode_ms_per_token"] / 1e3) / 1e9
    return Round(wq, threads, stream.gbps_median, fma.gbps_median, round(weights_gbps, 2),
                 round(step_gbps, 2))


def spread(values: list[float]) -> list[float]:
    """[median, min, max], rounded for a table."""
    return [round(statistics.median(values), 3), round(min(values), 3), round(max(values), 3)]


def summarise(rounds: list[Round]) -> Summary:
    """Medians of each series and of the ratios taken within each round."""
    first = rounds[0]
    if any((r.wq, r.threads) != (first.wq, first.threads) for r in rounds):
        raise ValueError("summarise takes the rounds of one configuration")
    return Summary(
        first.wq, first.threads, len(rounds),
        statistics.median(r.stream_gbps for r in rounds),
        statistics.median(r.fma_gbps for r in rounds),
        statistics.median(r.lmc_weights_gbps for r in rounds),
        statistics.median(r.lmc_step_gbps for r in rounds),
        spread([r.lmc_weights_gbps / r.stream_gbps for r in rounds]),
        spread([r.lmc_weights_gbps / r.fma_gbps for r in rounds]),
        spread([r.fma_gbps / r.stream_gbps for r in rounds]))


def markdown_table(summaries: list[Summary]) -> str:
    def ratio(r: list[float]) -> str:
        return f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"

    lines = [
        "| weights | threads | rounds | STREAM sum GB/s | bare FMA GB/s | lmc weights GB/s "
        "(step − attention) | lmc whole step GB/s | lmc weights / STREAM | lmc weights / FMA "
        "| FMA / STREAM |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(f"| {s.wq} | {s.threads} | {s.rounds} | {s.stream_gbps:.1f} "
                     f"| {s.fma_gbps:.1f} | {s.lmc_weights_gbps:.1f} | {s.lmc_step_gbps:.1f} "
                     f"| {ratio(s.lmc_of_stream)} | {ratio(s.lmc_of_fma)} "
                     f"| {ratio(s.fma_of_stream)} |")
    return "\n".join(lines)


def scaling_lines(summaries: list[Summary]) -> list[str]:
    """How each series scales from one thread to each larger count (ratio of medians)."""
    one = {s.wq: s for s in summaries if s.threads == 1}
    lines = []
    for s in summaries:
        base = one.get(s.wq)
        if base is None or s.threads == 1:
            continue
        lines.append(
            f"{s.wq}, {s.threads} threads over 1: STREAM {s.stream_gbps / base.stream_gbps:.2f}x, "
            f"FMA {s.fma_gbps / base.fma_gbps:.2f}x, "
            f"lmc weights {s.lmc_weights_gbps / base.lmc_weights_gbps:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    from qwen3_06b import generate as generate_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="HF model dir (default: the bench model, BF16)")
    parser.add_argument("--wq", nargs="+", choices=("f32", "q8", "bf16"), default=["f32"])
    parser.add_argument("--threads", type=positive_int, nargs="+",
                        default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--prompt-len", type=int, default=448)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--stream-mib", type=int, default=1024)
    parser.add_argument("--stream-passes", type=int, default=5)
    parser.add_argument("--rev", help="build lmc from this git revision (default: work tree)")
    parser.add_argument("--json", type=Path, help="also write every round here")
    args = parser.parse_args(argv)

    lmc = engine_binary(args.rev)
    model_dir = args.model or generate_model(dtypes=("BF16",))["BF16"]
    shape = Shape.from_model_dir(model_dir)
    prompt = bench_prompt(args.prompt_len, shape.vocab)
    env = environment(lmc)
    configs = [(wq, t) for t in args.threads for wq in args.wq]
    rounds: dict[tuple[str, int], list[Round]] = {c: [] for c in configs}
    for i in range(args.rounds):
        for wq, threads in configs:  # alternate so a change in the host hits every series alike
            r = measure_round(lmc, model_dir, shape, prompt, args.decode, wq, threads,
                              args.stream_mib, args.stream_passes)
            rounds[wq, threads].append(r)
            print(f"  round {i + 1}/{args.rounds} {wq} x{threads}: STREAM {r.stream_gbps:.1f}, "
                  f"FMA {r.fma_gbps:.1f}, lmc weights {r.lmc_weights_gbps:.1f} GB/s",
                  file=sys.stderr, flush=True)
    summaries = [summarise(rounds[c]) for c in configs]
    print(markdown_table(summaries))
    for line in scaling_lines(summaries):
        print(line)
    print(f"environment: {json.dumps(env)}\nloadavg after: {environment()['loadavg']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "environment": env, "prompt_len": args.prompt_len, "decode": args.decode,
            "rounds": [asdict(r) for rs in rounds.values() for r in rs],
            "summaries": [asdict(s) for s in summaries]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
