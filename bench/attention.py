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

Every table also gives what each sparse variant's step reads, as a fraction of exact's bytes,
counted from the blocks it selected (`--trace-selection` of one untimed pass): the probe keys
(or key centroids), read once per GQA group (centroids once per head), plus the K and V rows of
the union of the group's blocks, each read once for the group. Where the time ratio sits at the
bytes ratio, the step runs at exact's rate per byte and only reading less would make it faster.

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
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engines.lmc import run_here  # noqa: E402
from harness.engines.lmc.build import build_engine  # noqa: E402
from harness.errors import RunFailure  # noqa: E402

POLICIES = {
    "exact": ["--attn", "exact"],
    "sparse k=32": ["--attn", "sparse", "--k", "32"],
    "quest k=32": ["--attn", "quest", "--k", "32"],
    "sparse k=32 summary": ["--attn", "sparse", "--k", "32", "--probe-summary"],
}


STAGES = ("probe", "importance", "select", "gather", "attend")
BLOCK, PROBES = 32, 8  # lmc's defaults, which POLICIES run with


def row_bytes(head_dim: int, kv: str) -> int:
    """One head's key (or value) row: f32, or q8 values with an f32 scale per 32."""
    return head_dim * 4 if kv == "f32" else head_dim + 4 * -(-head_dim // 32)


def probe_rows(ctx: int, summary: bool) -> int:
    """Rows one head's probing reads (select.c): per full block its probes at the stride
    block / probes (or one centroid row), per partial block its own stride."""
    full, rows = ctx // BLOCK, 0
    if ctx % BLOCK:
        step = max(1, (ctx % BLOCK) // PROBES)
        rows += -(-(ctx % BLOCK) // step)
    return rows + full * (1 if summary else -(-BLOCK // max(1, BLOCK // PROBES)))


def bytes_fraction(trace: Path, ctx: int, args: argparse.Namespace, summary: bool) -> float:
    """What the grouped sparse step read, over exact's bytes (see the module docstring)."""
    chosen: dict[int, set[int]] = {}  # KV head -> union of its query heads' blocks
    for line in trace.read_text().splitlines():
        if line.startswith("#"):
            continue
        pos, layer, head, _, *ids = map(int, line.split())
        if layer == 0 and pos == ctx - 1:
            chosen.setdefault(head // (args.heads // args.kv_heads), set()).update(ids)
    row = row_bytes(args.head_dim, args.kv)
    probes = probe_rows(ctx, summary) * row * (args.heads if summary else args.kv_heads)
    attended = sum(min(BLOCK, ctx - b * BLOCK) for blocks in chosen.values() for b in blocks)
    return (probes + 2 * attended * row) / (2 * ctx * args.kv_heads * row)


def one_run(binary: str, ctx: int, args: argparse.Namespace, policy: list[str],
            extra: Sequence[str] = ()) -> dict:
    """attn-bench's document: "ms" (the median pass) and with --stages "stages"."""
    options = ["--ctx", str(ctx), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
               "--head-dim", str(args.head_dim), "--kv", args.kv, "--threads", str(args.threads),
               "--runs", str(args.runs), "--warmup", "1", "--layers", str(args.layers), *policy,
               *(["--stages"] if args.stages else []), *extra]
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
    fractions: dict[int, dict[str, float]] = {}
    for ctx in args.ctx:
        samples: dict[str, list[float]] = {name: [] for name in POLICIES}
        stages[ctx] = {name: [] for name in POLICIES}
        for _ in range(args.rounds):
            for name, policy in POLICIES.items():
                doc = one_run(binary, ctx, args, policy)
                samples[name].append(doc["ms"])
                if args.stages:
                    stages[ctx][name].append(doc["stages"])
        with tempfile.TemporaryDirectory() as tmp:  # what each sparse step reads
            for name, policy in POLICIES.items():
                if "sparse" in policy:
                    trace = Path(tmp) / "trace.txt"
                    one_run(binary, ctx, args, policy, ["--trace-selection", str(trace)])
                    fractions.setdefault(ctx, {})[name] = bytes_fraction(
                        trace, ctx, args, "--probe-summary" in policy)
        results[ctx] = {name: statistics.median(v) for name, v in samples.items()}
        # per round, side by side: the spread of each policy's ratio to exact
        ratios[ctx] = {name: [s / e for s, e in zip(v, samples["exact"], strict=True)]
                       for name, v in samples.items()}
    load_after = os.getloadavg()

    if args.json:
        print(json.dumps({"config": vars(args) | {"binary": binary}, "ms": results,
                          "ratios": ratios, "bytes_fraction": fractions,
                          "stages": stages if args.stages else None,
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
    print("\nbytes a step reads, over exact's (probe keys once per GQA group, centroids once "
          "per head, the union of a group's blocks once): time ratio / bytes ratio")
    for ctx in results:
        print(f"{ctx:>6} | " + " | ".join(
            f"{name} {statistics.median(ratios[ctx][name]):.3f} / {f:.3f}"
            for name, f in fractions[ctx].items()))
    if args.stages:
        print("\nstages, ms per pass (median over rounds; faults: page faults in the timed "
              "passes, the most of any round)")
        print("\n".join(stage_table(stages)))
    print(f"\nloadavg before {[round(x, 2) for x in load_before]}, "
          f"after {[round(x, 2) for x in load_after]}")


if __name__ == "__main__":
    main()
