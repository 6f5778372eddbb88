"""lmc at each x86-64 instruction-set level this machine runs, side by side: prefill and decode.

One ``lmc generate`` per (level, weight format) and round, each in a process of its own, the
levels in alternating order (v2 v3 v4 ... then reversed), on the Qwen3-0.6B-shaped random model
of ``bench/qwen3_06b.py`` with ``--layers L`` of its layers (or ``--model DIR``). Every run
must give the v3 build's tokens. Reported per level: the median [min, max] over rounds of the
prefill's ms and the decode's ms per token, and each round's ratio to v3 (v3 / level: above 1,
the level is faster). The load average is printed before and after: on a shared machine only
the ratios taken in one round mean anything.

    .venv/bin/python bench/isa_levels.py --layers 4 --prompt 128 --decode 16 --rounds 3
    .venv/bin/python bench/isa_levels.py --levels v3 v4 v4-vnni --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from depth4096 import model_directory  # noqa: E402
from roofline import bench_prompt, run_lmc_generate  # noqa: E402

from devices import isa  # noqa: E402
from harness.engines.lmc.build import build_engine  # noqa: E402


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):9.2f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="layers of the 0.6B shape")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--decode", type=int, default=16, help="decode steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--wq", nargs="+", default=["f32", "bf16", "q8"])
    parser.add_argument("--levels", nargs="+", help="the levels to run (default: every one "
                        "this machine has; v2, portable C, is 20-100x slower)")
    args = parser.parse_args(argv)

    here = [lv.name for lv in isa.LEVELS["x86_64"] if not isa.missing(lv, isa.host_features())
            and (args.levels is None or lv.name in args.levels or lv.name == "v3")]
    if "v3" not in here:
        print("this machine has no x86-64-v3: nothing to compare against", file=sys.stderr)
        return 2
    binaries = {name: Path(build_engine(target=f"x86_64:{name}").binary) for name in here}
    model = model_directory(args)
    prompt = bench_prompt(args.prompt, 151936 if args.model is None else 1000)
    load_before = os.getloadavg()
    prefill: dict[tuple[str, str], list[float]] = {}
    decode: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        order = here if round_ % 2 == 0 else here[::-1]
        for wq in args.wq:
            tokens = {}
            for name in order:
                doc = run_lmc_generate(binaries[name], model, prompt, args.decode, args.threads,
                                       wq=wq)
                tokens[name] = doc["tokens"]
                prefill.setdefault((name, wq), []).append(doc["prefill_ms"])
                decode.setdefault((name, wq), []).append(doc["decode_ms_per_token"])
            if any(t != tokens["v3"] for t in tokens.values()):
                print(f"round {round_}, wq {wq}: the levels' tokens differ: {tokens}",
                      file=sys.stderr)
                return 1
    print(f"model {model}, prompt {args.prompt}, decode {args.decode}, threads {args.threads}, "
          f"{args.rounds} rounds")
    print(f"{'wq':5} {'level':8} {'prefill ms':>26} {'v3/level':>20} {'decode ms/tok':>26} "
          f"{'v3/level':>20}")
    for wq in args.wq:
        for name in here:
            pre, dec = prefill[(name, wq)], decode[(name, wq)]
            pre_ratio = [b / a for a, b in zip(pre, prefill[("v3", wq)], strict=True)]
            dec_ratio = [b / a for a, b in zip(dec, decode[("v3", wq)], strict=True)]
            print(f"{wq:5} {name:8} {summary(pre):>26} {summary(pre_ratio):>20} "
                  f"{summary(dec):>26} {summary(dec_ratio):>20}")
    print(f"loadavg before {[round(x, 2) for x in load_before]}, "
          f"after {[round(x, 2) for x in os.getloadavg()]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
