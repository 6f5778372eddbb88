"""Needle recall grid of a model: context lengths x depths x seeds, greedy, printed as a table.

    .venv/bin/python bench/needle_grid.py                        # lmc, exact attention, full grid
    .venv/bin/python bench/needle_grid.py --ctx 4096 8192        # the measured long contexts
    .venv/bin/python bench/needle_grid.py --attn sparse --k 4    # a sparse policy
    .venv/bin/python bench/needle_grid.py --backend transformers # the reference implementation

Without --lmc the engine is built from the working tree (harness.engines.lmc.build). Output: a
markdown table (found/total per depth, recall per context length) and, with --json, every cell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engines.lmc import generator as lmc_generator  # noqa: E402
from harness.workloads.grid import format_grid, recall_grid, transformers_generator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEPTHS = [round(0.1 * i, 1) for i in range(11)]


def main() -> int:
    parser = argparse.ArgumentParser(description="needle recall grid")
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "needle-tiny")
    parser.add_argument("--ctx", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--depths", type=float, nargs="+", default=DEPTHS)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--backend", choices=("lmc", "transformers"), default="lmc")
    parser.add_argument("--lmc", type=Path, help="lmc binary (default: build it)")
    parser.add_argument("--attn", default="exact", help="lmc --attn policy")
    parser.add_argument("--k", type=int, help="lmc --k (blocks kept by sparse policies)")
    parser.add_argument("--block", type=int, help="lmc --block")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every cell here")
    args = parser.parse_args()

    if args.backend == "transformers":
        generate = transformers_generator(args.model)
        label = "transformers (exact attention)"
    else:
        lmc = args.lmc
        if lmc is None:
            from harness.engines.lmc.build import build_engine

            lmc = Path(build_engine(target="x86_64").binary)
        extra = ["--attn", args.attn, "--threads", str(args.threads)]
        for flag, value in (("--k", args.k), ("--block", args.block)):
            if value is not None:
                extra += [flag, str(value)]
        generate = lmc_generator(lmc, args.model, extra)
        label = "lmc " + " ".join(extra)

    started = time.time()
    cells = recall_grid(generate, args.model, args.ctx, args.depths, range(args.seeds),
                        progress=lambda c: print(
                            f"ctx {c.ctx} depth {c.depth:g} seed {c.seed}: "
                            f"{'found' if c.found else 'MISSED'} ({c.prompt_tokens} tokens)",
                            file=sys.stderr, flush=True))
    minutes = (time.time() - started) / 60
    recall = sum(c.found for c in cells) / len(cells)
    print(f"needle recall of {args.model.name} with {label}, seeds 0..{args.seeds - 1}, "
          f"{len(cells)} prompts, {minutes:.1f} min")
    print(format_grid(cells))
    print(f"overall recall: {recall:.3f}")
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
