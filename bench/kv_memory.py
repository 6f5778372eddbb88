"""What --kv-budget saves in memory: lmc's KV bytes and peak RSS at budgets of the context.

One ``lmc generate`` per budget over the same prompt (``--ctx`` tokens less the decode steps,
``--max-new`` decoded), each in a process of its own: exact attention without a budget, then
the policy with ``--kv-budget`` at each fraction of the context, evicting during prefill
(``--prefill-attn sparse``) so that the budget holds from the first block. Prints each run's
``kv_memory`` (engine/README.md, Eviction: the K and V bytes of the slots touched, of the blocks
held at most, reserved) and peak RSS, and the ratios to exact's. Memory is deterministic: one
run per budget suffices. Prefill times are the host's: with ``--rounds N`` the runs repeat in
turn (exact, each budget, exact, ...) and each budget's prefill is compared with the exact run
of its own round (median and range of those ratios).

    .venv/bin/python bench/kv_memory.py --layers 4                       # 8K, 25 % and 50 %
    .venv/bin/python bench/kv_memory.py --layers 4 --policy h2o --ctx 4096
    .venv/bin/python bench/kv_memory.py --layers 4 --threads 1 --budgets 0.25 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from depth4096 import model_directory
from qwen3_06b import QWEN3_06B
from roofline import Shape, bench_prompt, engine_binary, finish, run_lmc_generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=8192, help="context: prompt + decode")
    parser.add_argument("--max-new", type=int, default=8)
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.25, 0.5],
                        help="fractions of --ctx")
    parser.add_argument("--policy", default="window", help="the evicting --attn policy")
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--wq", default="q8", choices=("f32", "q8", "bf16"))
    parser.add_argument("--layers", type=int, default=QWEN3_06B.layers,
                        help="layers of the 0.6B-shaped model")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every cell, in turn")
    parser.add_argument("--json", type=Path, help="also write every document's figures here")
    args = parser.parse_args(argv)

    lmc = engine_binary()
    model_dir = model_directory(args)
    prompt = bench_prompt(args.ctx - args.max_new, Shape.from_model_dir(model_dir).vocab)
    load_before = os.getloadavg()
    runs: dict[str, dict] = {}
    prefills: dict[str, list[float]] = {}
    cells = [("exact", ())] + [
        (f"{args.policy} {b:.0%}", ("--attn", args.policy, "--block", str(args.block),
                                    "--kv-budget", str(int(b * args.ctx)),
                                    "--prefill-attn", "sparse")) for b in args.budgets]
    for _ in range(args.rounds):
        for name, extra in cells:
            doc = run_lmc_generate(lmc, model_dir, prompt, args.max_new, args.threads, args.wq,
                                   ctx=args.ctx, timeout=7200, extra=extra)
            runs[name] = {"kv_memory": doc["kv_memory"], "peak_rss_kb": doc["peak_rss_kb"],
                          "weights_bytes": doc["weights_bytes"], "tokens": doc["tokens"]}
            prefills.setdefault(name, []).append(doc["prefill_ms"])
            print(f"  {name}: prefill {doc['prefill_ms'] / 1e3:.1f} s, peak RSS "
                  f"{doc['peak_rss_kb'] / 1e3:.0f} MB, {json.dumps(doc['kv_memory'])}",
                  file=sys.stderr)
    load_after = os.getloadavg()
    exact = runs["exact"]
    print(f"KV memory, context {args.ctx} ({len(prompt)} prompt + {args.max_new} decoded), "
          f"weights {args.wq}, block {args.block}, model {model_dir}")
    print("| run | KV resident MB | ratio | KV peak held MB | ratio | peak RSS MB | ratio | "
          "prefill s (each round) | prefill / exact's, median [min, max] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        mem, base = run["kv_memory"], exact["kv_memory"]
        ratios = sorted(a / b for a, b in zip(prefills[name], prefills["exact"], strict=True))
        print(f"| {name} | {mem['resident_bytes'] / 1e6:.1f} | "
              f"{mem['resident_bytes'] / base['resident_bytes']:.3f} | "
              f"{mem['peak_live_bytes'] / 1e6:.1f} | "
              f"{mem['peak_live_bytes'] / base['peak_live_bytes']:.3f} | "
              f"{run['peak_rss_kb'] / 1e3:.0f} | {run['peak_rss_kb'] / exact['peak_rss_kb']:.3f} | "
              f"{' / '.join(f'{ms / 1e3:.1f}' for ms in prefills[name])} | "
              f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}] |")
    print(f"reserved (virtual) KV: {exact['kv_memory']['allocated_bytes'] / 1e6:.1f} MB; "
          f"resident weights: {exact['weights_bytes'] / 1e6:.1f} MB")
    finish(lmc, (load_before, load_after), args.json,
           {"args": vars(args), "runs": runs, "prefill_ms": prefills})
    return 0


if __name__ == "__main__":
    sys.exit(main())
