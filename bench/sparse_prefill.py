"""Sparse prefill against exact prefill: lmc's time to first token with `--prefill-attn sparse`
beside exact prefill attention, side by side.

The same model and prompt as ``bench/prefill.py`` (the 0.6B-shaped random model, ``--layers
L`` of its layer shape, or ``--model DIR``), ``lmc generate --max-new 0``: each round runs
exact prefill and each ``--config`` (lmc options; default sparse k = 32 in prefill and decode),
in alternating order (exact first in odd rounds, last in even ones), each in a process of its
own. Per run: lmc's ``prefill_ms`` and the process's user CPU seconds less an 8-token baseline
run of the same options (the load and the conversion); with one thread user CPU seconds are
what the prefill computed, whatever the other jobs did. A ratio is exact's over the config's
in the same round (above 1: the config is faster), median [min, max] over rounds.

    .venv/bin/python bench/sparse_prefill.py --prompt 4096 --layers 4 --rounds 3
    .venv/bin/python bench/sparse_prefill.py --prompt 4096 --layers 4 \\
        --config "--attn sparse --prefill-attn sparse" "--attn sparse --prefill-attn sparse --k 16"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from depth4096 import model_directory
from prefill import BASELINE_TOKENS, run_lmc, spread
from qwen3_06b import QWEN3_06B
from roofline import Shape, bench_prompt, engine_binary, finish

EXACT = "exact"
SPARSE = "--attn sparse --prefill-attn sparse"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--config", nargs="+", default=[SPARSE],
                        help="lmc options of each config timed against exact prefill")
    parser.add_argument("--wq", choices=("f32", "q8"), default="q8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=QWEN3_06B.layers,
                        help="layers of the 0.6B-shaped model")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    parser.add_argument("--isa", help="the instruction-set level lmc is built for "
                        "(devices/isa.py; default: the highest this machine runs)")
    args = parser.parse_args(argv)
    if args.prompt <= BASELINE_TOKENS or args.rounds < 1:
        parser.error(f"--prompt must be > {BASELINE_TOKENS} and --rounds >= 1")

    lmc = engine_binary(isa=args.isa)
    model_dir = model_directory(args)
    vocab = Shape.from_model_dir(model_dir).vocab
    prompt, baseline = bench_prompt(args.prompt, vocab), bench_prompt(BASELINE_TOKENS, vocab)
    configs = [EXACT, *args.config]
    runs: dict[str, dict[str, list[float]]] = {c: {"ms": [], "cpu_s": []} for c in configs}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            extra = () if config == EXACT else tuple(config.split())
            ms, cpu = run_lmc(lmc, model_dir, prompt, args.wq, args.threads, extra)
            base = run_lmc(lmc, model_dir, baseline, args.wq, args.threads, extra)[1]
            runs[config]["ms"].append(ms)
            runs[config]["cpu_s"].append(cpu - base)
            print(f"  round {r + 1}/{args.rounds} {config}: {ms:.0f} ms, "
                  f"{cpu - base:.2f} CPU s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    load_after = os.getloadavg()

    print(f"prefill of {args.prompt} tokens, {args.rounds} rounds, model {model_dir}, "
          f"--wq {args.wq}, {args.threads} thread(s)")
    print("| config | prefill ms (median) | user CPU s (median) | exact / config, wall: median "
          "[min, max] | exact / config, user CPU s |")
    print("|---|---|---|---|---|")
    exact = runs[EXACT]
    for config in configs:
        got = runs[config]
        wall = [e / c for e, c in zip(exact["ms"], got["ms"], strict=True) if c > 0]
        cpu = [e / c for e, c in zip(exact["cpu_s"], got["cpu_s"], strict=True) if c > 0]
        print(f"| {config} | {statistics.median(got['ms']):.0f} | "
              f"{statistics.median(got['cpu_s']):.2f} | {spread(wall)} | {spread(cpu)} |")
    finish(lmc, (load_before, load_after), args.json, {"args": vars(args), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
