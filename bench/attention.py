"""Decode-step attention: exact vs sparse k=32 vs quest k=32 (and sparse with summary probing).

Runs `lmc attn-bench` (one decode step, all heads, seeded synthetic Q/K/V) at several context
lengths and prints the median milliseconds of each policy and its ratio to exact. Policies
are run side by side: every round runs each policy once, in turn, so slow drift of the
machine affects all of them alike; the figure is the median over rounds.

    .venv/bin/python bench/attention.py                      # 1K, 4K, 16K, 32K; 5 rounds
    .venv/bin/python bench/attention.py --ctx 4096 --kv q8 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.build import build_engine  # noqa: E402
from harness.engines.lmc import run_here  # noqa: E402
from harness.errors import RunFailure  # noqa: E402

POLICIES = {
    "exact": ["--attn", "exact"],
    "sparse k=32": ["--attn", "sparse", "--k", "32"],
    "quest k=32": ["--attn", "quest", "--k", "32"],
    "sparse k=32 summary": ["--attn", "sparse", "--k", "32", "--probe-summary"],
}


def one_run(binary: str, ctx: int, args: argparse.Namespace, policy: list[str]) -> float:
    options = ["--ctx", str(ctx), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
               "--head-dim", str(args.head_dim), "--kv", args.kv, "--threads", str(args.threads),
               "--runs", str(args.runs), "--warmup", "1", *policy]
    try:
        return run_here(binary, "attn-bench", None, None, options)["ms"]
    except RunFailure as exc:
        sys.exit(str(exc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (>= 5)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs inside one process")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kv", choices=["f32", "q8"], default="f32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--binary", help="an lmc binary (default: build the working tree)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    binary = args.binary or build_engine().binary

    results: dict[int, dict[str, float]] = {}
    for ctx in args.ctx:
        samples: dict[str, list[float]] = {name: [] for name in POLICIES}
        for _ in range(args.rounds):
            for name, policy in POLICIES.items():
                samples[name].append(one_run(binary, ctx, args, policy))
        results[ctx] = {name: statistics.median(v) for name, v in samples.items()}

    if args.json:
        print(json.dumps({"config": vars(args) | {"binary": binary}, "ms": results}, indent=2))
        return
    print(f"decode attention, one step, {args.heads} heads / {args.kv_heads} KV heads x "
          f"{args.head_dim}, KV {args.kv}, {args.threads} thread(s), median of {args.rounds} "
          f"rounds x {args.runs} runs")
    names = list(POLICIES)
    header = f"{'ctx':>6} | {'exact ms':>9}"
    for name in names[1:]:
        header += f" | {name + ' ms':>22} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for ctx, ms in results.items():
        line = f"{ctx:>6} | {ms['exact']:>9.3f}"
        for name in names[1:]:
            line += f" | {ms[name]:>22.3f} | {ms[name] / ms['exact']:>6.3f}"
        print(line)


if __name__ == "__main__":
    main()
