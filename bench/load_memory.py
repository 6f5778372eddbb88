"""The loader's peak memory, before and after: lmc from --base-rev against the work tree's, on
the Qwen3-0.6B-shaped random bf16 model with --layers L of its layers, one file and the same
weights in --shards shards, for each --wq: ``lmc generate`` of a short prompt (load, one
prefill, a few steps), each run its own process, the two binaries one after the other. Prints each
run's peak RSS, the work tree's ``weights_bytes`` (the weights as they stay resident) and the
ratio of each peak to it. Memory is deterministic: one round suffices.

The work tree's lmc reads its peak from VmHWM (its own address space); an lmc from before
issue 40 reports getrusage's ru_maxrss, which Linux carries over exec from the parent: the
larger of its own peak and this Python's (printed), so its figure is its own when above that.

    .venv/bin/python bench/load_memory.py --layers 4
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from depth4096 import model_directory  # noqa: E402
from loader_cost import sharded_copy  # noqa: E402
from roofline import bench_prompt, run_lmc_generate  # noqa: E402

from harness.engines.lmc.build import build_engine  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="layers of the 0.6B shape")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--base-rev", default="main", help="the lmc compared against")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--wq", nargs="+", default=["q8", "bf16", "f32"])
    parser.add_argument("--isa", default="v3", help="the level both are built for")
    args = parser.parse_args(argv)

    target = f"{os.uname().machine}:{args.isa}"
    binaries = {"before": Path(build_engine(target=target, rev=args.base_rev).binary),
                "after": Path(build_engine(target=target).binary)}
    single = model_directory(args)
    layouts = {"one file": single, f"{args.shards} shards": sharded_copy(single, args.shards)}
    prompt = bench_prompt(16, 151936 if args.model is None else 1000)
    print(f"model {single}; before: lmc at {args.base_rev}, after: the work tree")
    print(f"{'layout':10} {'wq':5} {'weights MB':>11} {'before MB':>10} {'x':>6} "
          f"{'after MB':>9} {'x':>6}")
    for name, model in layouts.items():
        for wq in args.wq:
            docs = {which: run_lmc_generate(binary, model, prompt, 2, 1, wq=wq)
                    for which, binary in binaries.items()}
            peaks = {which: doc["peak_rss_kb"] * 1024 for which, doc in docs.items()}
            weights = docs["after"]["weights_bytes"]  # the engine before printed none
            print(f"{name:10} {wq:5} {weights / 1e6:11.1f} {peaks['before'] / 1e6:10.1f} "
                  f"{peaks['before'] / weights:6.2f} {peaks['after'] / 1e6:9.1f} "
                  f"{peaks['after'] / weights:6.2f}")
    own_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"this Python's peak RSS: {own_kb / 1e3:.1f} MB (a before figure above it is the "
          "engine's own); loadavg " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
