"""lmc against llama.cpp's llama-bench, decoding at depth: prompt 4096, then 32 decode steps.

llama-bench's `-d` convention (``-p 0 -n DECODE -d DEPTH``: the context is filled with DEPTH
tokens, untimed, then DECODE tokens are generated and timed) against lmc ``generate`` with a
DEPTH-token prompt and ``--max-new DECODE``, timing lmc's decode steps the same way: tokens/s =
DECODE / (the sum of the steps' ms). lmc runs with exact attention and with sparse k=32 (the
seed's selection; prefill stays exact), llama.cpp with its own (exact) attention; weights q8
(llama.cpp q8_0, converted from the same safetensors by ``harness.engines.llamabench.gguf``),
the same threads. KV cache: llama-bench takes no f32 cache, so ``--kv f16`` (llama.cpp's
default) pairs its f16 cache with lmc's f32 (lmc has no f16 cache: it reads twice llama.cpp's
KV bytes) and ``--kv q8_0`` pairs llama.cpp's q8_0 cache with lmc's q8 (both 8-bit values with
a scale per 32). lmc runs with ``--kv-prefault``: its KV pages are written before the prompt,
as llama-bench's are when it makes its context, so no timed step pays a page's first touch.
Every round runs the three in turn, in alternating order (ABC, CBA, ...), each in a process of
its own; a ratio is lmc's tokens/s over llama.cpp's in the same round, reported as median [min,
max] over rounds with the CV of each engine's tokens/s. The load average is printed before and
after: the machine may be shared. llama.cpp's OpenMP threads spin at their barriers by default
(``OMP_WAIT_POLICY=active``, its fastest on a quiet machine); on a loaded one a spinning
barrier waits out whole time slices, so ``--omp-wait-policy passive`` is the fairer setting
there (see bench/vs_llamacpp.py).

The model is the Qwen3-0.6B-shaped random model (``bench/qwen3_06b.py``, ~2 min to write;
``--layers N`` writes a shallower one of the same layer shape, so the prefill that fills the
context costs less on a small machine), or ``--model DIR`` (any Hugging Face directory lmc and
the converter read). llama-bench is built from the pinned llama-cpp-python sdist
(``benchfarm build --engine llama-bench``; reused from ``~/.cache/benchfarm/llama-cpp/``).

    .venv/bin/python bench/depth4096.py                          # 0.6B shape, 3 rounds
    .venv/bin/python bench/depth4096.py --layers 4 --rounds 5
    .venv/bin/python bench/depth4096.py --depth 128 --decode 64 --policies exact   # plain decode
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_06b import DEFAULT_ROOT, QWEN3_06B
from qwen3_06b import generate as generate_model
from roofline import Shape, bench_prompt, engine_binary, finish, run_lmc_generate

from harness.engines.llamabench.build import build_llama_bench
from harness.engines.llamabench.gguf import ensure_converted

POLICIES = {"exact": (), "sparse": ("--attn", "sparse", "--k", "32")}
LMC_WQ = {"q8_0": "q8", "f32": "f32", "bf16": "bf16"}  # llama.cpp type -> lmc --wq
LMC_KV = {"f16": "f32", "q8_0": "q8"}  # llama.cpp cache type -> lmc --kv


@dataclass
class Series:
    name: str
    tokens_per_s: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)  # lmc only (llama-bench: untimed)

    def median(self) -> float:
        return statistics.median(self.tokens_per_s)

    def cv(self) -> float:
        values = self.tokens_per_s
        return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def run_llama_bench(binary: str, gguf: Path, args: argparse.Namespace) -> float:
    """tokens/s of one llama-bench tg<decode>@d<depth> test (one repetition after llama-bench's
    own one-token warm-up: the rounds are the repetitions)."""
    argv = [binary, "-m", str(gguf), "-p", "0", "-n", str(args.decode), "-d", str(args.depth),
            "-r", "1", "-t", str(args.threads), "-ctk", args.kv, "-ctv", args.kv,
            "-fa", args.flash_attn, "-o", "json"]
    env = dict(os.environ)
    if args.omp_wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    tests = json.loads(proc.stdout)
    if len(tests) != 1 or tests[0]["n_gen"] != args.decode or tests[0]["n_depth"] != args.depth:
        raise RuntimeError(f"llama-bench ran other tests than tg{args.decode}@d{args.depth}: "
                           f"{proc.stdout[:300]}")
    return float(tests[0]["avg_ts"])


def run_lmc(lmc: Path, model_dir: Path, prompt: list[int], policy: tuple[str, ...],
            args: argparse.Namespace) -> tuple[float, float]:
    """(decode tokens/s over all steps, prefill ms) of one lmc generate run."""
    doc = run_lmc_generate(lmc, model_dir, prompt, args.decode, args.threads,
                           LMC_WQ[args.gguf_type], LMC_KV[args.kv], ctx=args.depth + args.decode,
                           extra=policy, prefault=True)
    steps = [s["ms"] for s in doc["steps"]]
    if len(steps) != args.decode:
        raise RuntimeError(f"lmc decoded {len(steps)} tokens, not {args.decode}")
    return len(steps) * 1e3 / sum(steps), float(doc["prefill_ms"])


def model_directory(args: argparse.Namespace) -> Path:
    if args.model:
        return args.model
    shape = dataclasses.replace(QWEN3_06B, layers=args.layers)
    root = DEFAULT_ROOT
    if args.layers != QWEN3_06B.layers:
        root = DEFAULT_ROOT / f"layers-{args.layers}"
    return generate_model(root, ("BF16",), shape=shape)["BF16"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=4096, help="prompt tokens before decoding")
    parser.add_argument("--decode", type=int, default=32, help="decode steps timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--gguf-type", choices=tuple(LMC_WQ), default="q8_0")
    parser.add_argument("--kv", choices=tuple(LMC_KV), default="f16",
                        help="llama.cpp's KV cache (lmc's: f32 for f16, q8 for q8_0)")
    parser.add_argument("--policies", nargs="+", choices=tuple(POLICIES), default=list(POLICIES))
    parser.add_argument("--layers", type=int, default=QWEN3_06B.layers,
                        help="layers of the 0.6B-shaped model")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                        help="llama-bench -fa (its default: auto)")
    parser.add_argument("--omp-wait-policy", choices=("active", "passive", "inherit"),
                        default="active", help="llama.cpp's OpenMP barriers (see above)")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    parser.add_argument("--isa", default="v3",
                        help="the instruction-set level both engines are built for "
                        "(devices/isa.py; default %(default)s, the level of the figures in "
                        "docs/performance.md; v4-vnni: AVX-512 with VNNI)")
    args = parser.parse_args(argv)
    if args.depth < 1 or args.decode < 1 or args.rounds < 1:
        parser.error("--depth, --decode and --rounds must be >= 1")

    lmc = engine_binary(isa=args.isa)
    llama = build_llama_bench(f"{os.uname().machine}:{args.isa}").binary
    model_dir = model_directory(args)
    gguf = ensure_converted(model_dir, args.gguf_type)
    prompt = bench_prompt(args.depth, Shape.from_model_dir(model_dir).vocab)
    load_before = os.getloadavg()
    llama_series = Series("llama.cpp")
    lmc_series = {name: Series(f"lmc {name}") for name in args.policies}
    order: list[str] = ["llama.cpp", *args.policies]
    for r in range(args.rounds):
        for who in order if r % 2 == 0 else order[::-1]:
            if who == "llama.cpp":
                llama_series.tokens_per_s.append(run_llama_bench(llama, gguf, args))
            else:
                tps, prefill = run_lmc(lmc, model_dir, prompt, POLICIES[who], args)
                lmc_series[who].tokens_per_s.append(tps)
                lmc_series[who].prefill_ms.append(prefill)
            last = (llama_series if who == "llama.cpp" else lmc_series[who]).tokens_per_s[-1]
            print(f"  round {r + 1}/{args.rounds} {who}: {last:.2f} tok/s", file=sys.stderr)
    load_after = os.getloadavg()

    print(f"decode at depth {args.depth} ({args.decode} tokens), weights {args.gguf_type} "
          f"(lmc --wq {LMC_WQ[args.gguf_type]}), KV {args.kv} (lmc {LMC_KV[args.kv]}), "
          f"{args.threads} threads, llama.cpp -fa {args.flash_attn}, "
          f"OMP_WAIT_POLICY {args.omp_wait_policy}, "
          f"{args.rounds} rounds, model {model_dir}")
    print(f"{'engine':<12} | {'tok/s median':>12} | {'min':>7} | {'max':>7} | {'CV':>5} | "
          f"ratio to llama.cpp per round: median [min, max]")
    for series in [llama_series, *lmc_series.values()]:
        ratios = [a / b for a, b in zip(series.tokens_per_s, llama_series.tokens_per_s,
                                        strict=True)]
        print(f"{series.name:<12} | {series.median():>12.2f} | {min(series.tokens_per_s):>7.2f} | "
              f"{max(series.tokens_per_s):>7.2f} | {series.cv():>5.1%} | "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    for series in lmc_series.values():
        print(f"{series.name} prefill of {args.depth} tokens: "
              f"{statistics.median(series.prefill_ms) / 1e3:.1f} s (median; llama-bench's is "
              "untimed)")
    finish(lmc, (load_before, load_after), args.json,
           {"args": vars(args), "llama_bench": llama,
            "series": [dataclasses.asdict(s) for s in [llama_series, *lmc_series.values()]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
