"""What the loader's generality (the architectures besides Qwen3, sharded checkpoints) costs on
the Qwen3-0.6B-shaped bench model.

Three engines/layouts run in alternating rounds (A B C, then C B A, ...), each run its own
process, and every run must give the same tokens:
  A  lmc built from --base-rev (default main: before the architecture switches), one file
  B  lmc from the work tree, one file        (B/A: the switches' cost on the Qwen3 path)
  C  lmc from the work tree, the same weights in --shards shards  (C/B: sharding's cost)
Reported per run: the process's wall time (load included), prefill and decode ms per token;
the table gives medians and the ratios side by side, never one absolute time.

    .venv/bin/python bench/loader_cost.py                 # 5 rounds, 1 thread, --wq bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen3_06b  # noqa: E402
import shard_model  # noqa: E402
from roofline import bench_prompt, positive_int  # noqa: E402

from harness.engines.lmc import run_here  # noqa: E402
from harness.engines.lmc.build import build_engine  # noqa: E402


def run_once(lmc: str, model: Path, prompt: list[int], args: argparse.Namespace) -> dict:
    options = ["--max-new", str(args.decode), "--threads", str(args.threads), "--wq", args.wq]
    start = time.perf_counter()
    doc = run_here(lmc, "generate", model, prompt, options)
    wall = (time.perf_counter() - start) * 1000.0
    return {"wall_ms": wall, "prefill_ms": doc["prefill_ms"],
            "decode_ms": doc["decode_ms_per_token"], "tokens": doc["tokens"]}


def sharded_copy(single: Path, n_shards: int) -> Path:
    dst = single.with_name(f"{single.name}-{n_shards}shards")
    stamp, copied = single / "generated.json", dst / "generated.json"
    if (dst / shard_model.INDEX).is_file() and copied.is_file() \
            and copied.read_text() == stamp.read_text():
        return dst  # shard_checkpoint copied the stamp: the shards are of this model
    shard_model.shard_checkpoint(single, dst, n_shards)
    return dst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-rev", default="main", help="git revision of engine A")
    parser.add_argument("--shards", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--wq", choices=("f32", "bf16", "q8"), default="bf16")
    parser.add_argument("--prompt-len", type=positive_int, default=32)
    parser.add_argument("--decode", type=positive_int, default=32)
    args = parser.parse_args(argv)

    single = qwen3_06b.generate(dtypes=("BF16",))["BF16"]
    engines = {"A": (build_engine(rev=args.base_rev).binary, single),
               "B": (build_engine().binary, single),
               "C": (build_engine().binary, sharded_copy(single, args.shards))}
    prompt = bench_prompt(args.prompt_len, 151936)
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    for r in range(args.rounds):
        for key in sorted(engines, reverse=bool(r % 2)):
            runs[key].append(run_once(*engines[key], prompt, args))
    tokens = {json.dumps(run["tokens"]) for rs in runs.values() for run in rs}
    if len(tokens) != 1:
        print("error: the engines gave different tokens", file=sys.stderr)
        return 1

    med = {k: {m: statistics.median(run[m] for run in rs)
               for m in ("wall_ms", "prefill_ms", "decode_ms")} for k, rs in runs.items()}
    print(f"Qwen3-0.6B-shaped random model (BF16 file), --wq {args.wq}, {args.threads} thread(s), "
          f"prompt {args.prompt_len}, decode {args.decode}, {args.rounds} alternating rounds; "
          f"A = {args.base_rev}, C = {args.shards} shards; medians, ms")
    print("| run | wall (load incl.) | prefill | decode / token |")
    print("|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['wall_ms']:.0f} | {m['prefill_ms']:.0f} | {m['decode_ms']:.2f} |")
    for num, den in (("B", "A"), ("C", "B")):
        pairs = list(zip(runs[den], runs[num], strict=True))
        ratios = [statistics.median(b[m] / a[m] for a, b in pairs)
                  for m in ("wall_ms", "prefill_ms", "decode_ms")]
        print(f"| {num}/{den} (median of per-round ratios) | "
              + " | ".join(f"{x:.3f}" for x in ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
