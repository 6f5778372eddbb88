"""Decode-step attention: exact vs sparse k=32 vs quest k=32 (and sparse with summary probing).

Runs `lmc attn-bench` (one decode step, all heads, seeded synthetic Q/K/V) at several context
lengths and prints the median milliseconds of each policy and its ratio to exact. Policies
are run side by side: every round runs each policy once, in turn, so slow drift of the
machine affects all of them alike; the figure is the median over rounds. The load average is
printed before and after (the machine may be shared).

With ``--stages`` it also prints where each policy's step goes (`attn-bench --stages`: probe
scoring, the importance reservation, the rest of the selection, gathering a GQA group's blocks,
the attention kernel; medians over rounds of each stage's mean per pass) and the page faults
taken inside the timed passes (0 expected: every buffer is touched before).

    .venv/bin/python bench/attention.py                      # 1K, 4K, 16K, 32K; 5 rounds
    .venv/bin/python bench/attention.py --ctx 4096 32768 --rounds 5 --stages
    .venv/bin/python bench/attention.py --ctx 4096 --kv q8 --rounds 7
    .venv/bin/python bench/attention.py --ctx 4096 --layers 8   # KV from memory, as in decode

One layer attended pass after pass keeps what of its KV fits in the last-level cache; a policy
that reads less than that cache holds (sparse at 4K: about 16 MB of 33 MB) then runs from it,
which a decode step never does. ``--layers N`` attends N copies of the layer in turn (times per
layer): with N copies larger than the cache, every policy reads from memory, as in decode.
"""

from __future__ import annotations

import argparse
import json
import os
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


STAGES = ("probe", "importance", "select", "gather", "attend")


def one_run(binary: str, ctx: int, args: argparse.Namespace, policy: list[str]) -> dict:
    """attn-bench's document: "ms" (the median pass) and with --stages "stages"."""
    options = ["--ctx", str(ctx), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
               "--head-dim", str(args.head_dim), "--kv", args.kv, "--threads", str(args.threads),
               "--runs", str(args.runs), "--warmup", "1", "--layers", str(args.layers), *policy,
               *(["--stages"] if args.stages else [])]
    try:
        return run_here(binary, "attn-bench", None, None, options)
    except RunFailure as exc:
        sys.exit(str(exc))


def stage_table(stages: dict[int, dict[str, list[dict]]]) -> list[str]:
    """Per context and policy: the median over rounds of each stage's ms per pass."""
    lines = [f"{'ctx':>6} | {'policy':<20} | " + " | ".join(f"{s:>10}" for s in STAGES)
             + f" | {'other':>7} | {'mean ms':>8} | faults"]
    lines.append("-" * len(lines[0]))
    for ctx, by_policy in stages.items():
        for name, docs in by_policy.items():
            cells = [statistics.median(d["ms"][s] for d in docs) for s in STAGES]
            other = statistics.median(d["other_ms"] for d in docs)
            mean = statistics.median(d["mean_ms"] for d in docs)
            faults = max(d["minor_faults"] for d in docs)
            lines.append(f"{ctx:>6} | {name:<20} | " + " | ".join(f"{c:>10.3f}" for c in cells)
                         + f" | {other:>7.3f} | {mean:>8.3f} | {faults}")
    return lines


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
    parser.add_argument("--layers", type=int, default=1,
                        help="copies of the layer attended in turn per pass (KV from memory)")
    parser.add_argument("--binary", help="an lmc binary (default: build the working tree)")
    parser.add_argument("--stages", action="store_true", help="also the per-stage breakdown")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    binary = args.binary or build_engine().binary

    load_before = os.getloadavg()
    results: dict[int, dict[str, float]] = {}
    ratios: dict[int, dict[str, list[float]]] = {}
    stages: dict[int, dict[str, list[dict]]] = {}
    for ctx in args.ctx:
        samples: dict[str, list[float]] = {name: [] for name in POLICIES}
        stages[ctx] = {name: [] for name in POLICIES}
        for _ in range(args.rounds):
            for name, policy in POLICIES.items():
                doc = one_run(binary, ctx, args, policy)
                samples[name].append(doc["ms"])
                if args.stages:
                    stages[ctx][name].append(doc["stages"])
        results[ctx] = {name: statistics.median(v) for name, v in samples.items()}
        # per round, side by side: the spread of each policy's ratio to exact
        ratios[ctx] = {name: [s / e for s, e in zip(v, samples["exact"], strict=True)]
                       for name, v in samples.items()}
    load_after = os.getloadavg()

    if args.json:
        print(json.dumps({"config": vars(args) | {"binary": binary}, "ms": results,
                          "ratios": ratios, "stages": stages if args.stages else None,
                          "loadavg": {"before": load_before, "after": load_after}}, indent=2))
        return
    print(f"decode attention, one step, {args.heads} heads / {args.kv_heads} KV heads x "
          f"{args.head_dim}, KV {args.kv}, {args.threads} thread(s), {args.layers} layer(s) in "
          f"turn, median of {args.rounds} rounds x {args.runs} runs")
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
    print("\nratio to exact per round (side by side): median [min, max]")
    for ctx in results:
        print(f"{ctx:>6} | " + " | ".join(
            f"{name} {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"
            for name, r in ratios[ctx].items() if name != "exact"))
    if args.stages:
        print("\nstages, ms per pass (median over rounds; faults: page faults in the timed "
              "passes, the most of any round)")
        print("\n".join(stage_table(stages)))
    print(f"\nloadavg before {[round(x, 2) for x in load_before]}, "
          f"after {[round(x, 2) for x in load_after]}")


if __name__ == "__main__":
    main()
