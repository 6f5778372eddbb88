"""Prefill against llama.cpp: lmc's prefill of an N-token prompt beside llama-bench's ppN.

llama-bench ``-p N -n 0 -r 1`` (its own warm-up pass first, then one timed pass: its
``avg_ns``) against lmc ``generate`` with an N-token prompt, ``--max-new 0`` and ``--ctx N``
(lmc's ``prefill_ms``: every prompt token through every layer, the last token's logits; what
llama-bench's pp test times too), and ``--kv-prefault``: lmc's KV pages are written before the
prompt, as llama-bench's are when it makes its context (otherwise lmc's timed prefill pays each
page's first touch, which on a VM whose host takes free pages back costs up to seconds). Same
model (the Qwen3-0.6B-shaped random model of ``bench/qwen3_06b.py``, or ``--layers L`` of its
layer shape, or ``--model DIR``), the same weights converted to GGUF
(``harness.engines.llamabench.gguf``: f32, bf16 and q8_0 against lmc's ``--wq f32`` /
``bf16`` / ``q8``), the same threads. Each round runs every (type, threads) cell with both
engines, in alternating order (llama-bench first in odd rounds, lmc first in even ones), each
in a process of its own; a ratio is llama-bench's ms over lmc's in the same round (above 1:
lmc is faster), reported as median [min, max] over rounds.

On a shared machine wall times follow the other jobs more than the engines, so the bench also
takes each process's user CPU time (``getrusage`` of the child): with one thread, user CPU
seconds are what the prefill computes, whatever the scheduler did meanwhile. A baseline
process per engine and round with an 8-token prompt is subtracted (the load and conversion;
``--no-cpu-baseline`` skips it); llama-bench's warm-up is a second full pass, so its CPU is
halved after the subtraction (``--llama-no-warmup`` skips that pass, for prompts of 16K and
more, where it costs minutes). With two threads CPU time also counts waiting threads that spin
(llama.cpp's OpenMP barriers, lmc's pool), so only the wall ratio is given there. The load
average is printed before and after.

For one thread the bench also says how close each engine runs to this host's ceiling: the
prefill's operations (every weight product of every token, the last token's lm_head, causal
attention's scores and value sums) per user CPU second, against the best of
``bench/c/fma_peak.c`` built for the same level (12 chains of fused multiply-adds in registers,
at the level's width: 512 bits at v4, 256 at v3), and the fraction of that peak a prefill 1.3x
faster than llama-bench's would need; with ``--json`` each engine's share is stored too. At
v4-vnni (AVX512_BF16) bf16 is also set against the bf16 dot-product peak (``vdpbf16ps``, two
multiply-adds a lane): llama.cpp's bf16 products round their activations to bf16 and use it,
and so does lmc with ``--lmc-extra=--bf16-acts``.

Beside the whole prefill it gives lmc's weight products alone (``bench/c/matmul_rate.c``,
which links the working tree's ``matmul.c``): a chunk of tokens through every layer's products
with nothing between them, the weights read from memory as the prefill reads them
("streamed"), and one layer's weights again and again ("cached"). The products are 94 % of the
0.6B prefill's operations, so their streamed share of the peak bounds what the whole prefill
reaches with these kernels; cached against streamed says how much of the gap the memory makes.
Not with ``--rev`` (the kernels would not be that revision's) nor with sparse prefill.

    .venv/bin/python bench/prefill.py                   # 0.6B, f32 + q8_0, 1 + 2 threads
    .venv/bin/python bench/prefill.py --types q8_0 --threads 1 --rounds 5
    .venv/bin/python bench/prefill.py --prompt 4096 --layers 4       # long prompts, 4 layers
    .venv/bin/python bench/prefill.py --isa v4 --rev main            # lmc of another revision
    .venv/bin/python bench/prefill.py --isa v4-vnni --types bf16 --lmc-extra=--bf16-acts
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from depth4096 import LMC_WQ, model_directory
from qwen3_06b import QWEN3_06B
from roofline import Shape, bench_prompt, engine_binary, finish, run_lmc_generate

from harness import ENGINE_DIR
from harness.engines.llamabench.build import build_llama_bench
from harness.engines.llamabench.gguf import ensure_converted
from harness.engines.lmc.build import build_c_program, engine_sources

BASELINE_TOKENS = 8


def child_cpu_s() -> float:
    """User CPU seconds of the finished children: the prefill computes in user space; system
    time (page faults and zeroing while a model loads, several seconds for lmc, which converts
    the weights into memory it allocates, and varying from run to run with the host's memory
    pressure) is the loading's, and the 8-token baseline could not take it out reliably."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


@dataclass
class Cell:
    """One (weights, threads) cell: per round, each engine's ms and CPU seconds."""
    gguf_type: str
    threads: int
    lmc_ms: list[float] = field(default_factory=list)
    llama_ms: list[float] = field(default_factory=list)
    lmc_cpu_s: list[float] = field(default_factory=list)  # baseline subtracted
    llama_cpu_s: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.lmc_ms, self.llama_ms, strict=True)]

    def cpu_ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.lmc_cpu_s, self.llama_cpu_s, strict=True)
                if a > 0 and b > 0]


def run_llama(binary: str, gguf: Path, tokens: int, threads: int, wait_policy: str,
              warmup: bool = True) -> tuple[float, float]:
    """(ms of llama-bench's timed pp<tokens> pass, CPU seconds of the whole process)."""
    argv = [binary, "-m", str(gguf), "-p", str(tokens), "-n", "0", "-r", "1",
            "-t", str(threads), "-o", "json", *(() if warmup else ("--no-warmup",))]
    env = dict(os.environ, OMP_WAIT_POLICY=wait_policy.upper())
    before = child_cpu_s()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False,
                          env=env)
    cpu = child_cpu_s() - before
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    tests = json.loads(proc.stdout)
    if len(tests) != 1 or tests[0]["n_prompt"] != tokens or tests[0]["n_gen"] != 0:
        raise RuntimeError(f"llama-bench ran other tests than pp{tokens}: {proc.stdout[:300]}")
    return tests[0]["avg_ns"] / 1e6, cpu


def run_lmc(lmc: Path, model_dir: Path, prompt: list[int], wq: str, threads: int,
            extra: tuple[str, ...] = ()) -> tuple[float, float]:
    """(lmc's prefill_ms, CPU seconds of the whole process)."""
    before = child_cpu_s()
    doc = run_lmc_generate(lmc, model_dir, prompt, 0, threads, wq, ctx=len(prompt),
                           timeout=3600, extra=extra, prefault=True)
    return float(doc["prefill_ms"]), child_cpu_s() - before


def prefill_ops(shape: Shape, tokens: int) -> float:
    """Floating-point operations (a multiply-add is 2) of a prefill of ``tokens`` tokens."""
    h, d = shape.hidden, shape.head_dim
    per_token = shape.layers * (2 * shape.heads * d * h + 2 * shape.kv_heads * d * h
                                + 3 * shape.intermediate * h)
    causal_pairs = tokens * (tokens + 1) / 2  # (query, key) pairs
    attention = shape.layers * shape.heads * causal_pairs * d * 2 * 2  # scores, value sums
    return 2.0 * (per_token * tokens + shape.vocab * h) + attention


def sparse_prefill(lmc_options: tuple[str, ...]) -> bool:
    """Whether lmc's options make its prefill attention sparse (`--prefill-attn sparse`)."""
    pairs = zip(lmc_options, lmc_options[1:], strict=False)  # each option with the next word
    return any(option == "--prefill-attn" and value == "sparse" for option, value in pairs)


@dataclass
class FmaPeak:
    """bench/c/fma_peak.c built for one ISA level: its vector width and best pass."""
    isa: str
    simd: str
    bits: int
    gflops: float  # per CPU second
    dot_bf16_gflops: float | None = None  # vdpbf16ps's, where the level has AVX512_BF16


def fma_peak(isa: str) -> FmaPeak:
    """The best pass of bench/c/fma_peak.c built for ``isa`` (its widest vectors: 512 bits at
    v4) on this host, GFLOP per CPU second."""
    binary = build_c_program("fma_peak", [Path(__file__).resolve().parent / "c" / "fma_peak.c"],
                             target=f"{os.uname().machine}:{isa}")
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300, check=True)
    doc = json.loads(proc.stdout)
    dot = doc.get("dot_bf16_best_gflops")
    return FmaPeak(isa, doc["simd"], int(doc["bits"]), float(doc["best_gflops"]),
                   float(dot) if dot is not None else None)


@dataclass
class WeightProducts:
    """bench/c/matmul_rate.c built for one level: lmc's weight products alone, a prefill chunk
    through every layer, best of 3 passes in GFLOP per CPU second."""
    wq: str
    streamed: float  # every layer's own weights, read from memory as the prefill reads them
    cached: float  # layer 0's weights again and again: what the products do from the caches


def matmul_rate_binary(isa: str) -> Path:
    """bench/c/matmul_rate.c linked with the working tree's engine sources, built for ``isa``."""
    sources = [Path(__file__).resolve().parent / "c" / "matmul_rate.c",
               *(p for p in engine_sources(ENGINE_DIR) if p.name != "main.c")]
    return build_c_program("matmul_rate", sources, target=f"{os.uname().machine}:{isa}")


def matmul_rate(binary: Path, shape: Shape, wq: str, *flags: str) -> dict:
    """One run of matmul_rate for ``shape``'s layers: its JSON document."""
    argv = [str(binary), "--wq", wq, "--hidden", str(shape.hidden), "--heads", str(shape.heads),
            "--kv-heads", str(shape.kv_heads), "--head-dim", str(shape.head_dim),
            "--intermediate", str(shape.intermediate), "--layers", str(shape.layers), *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(proc.stdout)


def weight_products(binary: Path, shape: Shape, wq: str, bf16_acts: bool) -> WeightProducts:
    """lmc's weight products for ``shape`` without the rest of a prefill (``binary``:
    matmul_rate_binary's), one thread."""
    flags = ("--bf16-acts",) if bf16_acts else ()
    return WeightProducts(
        wq, matmul_rate(binary, shape, wq, *flags)["best_gflops_per_cpu_s"],
        matmul_rate(binary, shape, wq, "--cached", *flags)["best_gflops_per_cpu_s"])


def print_weight_products(shares: list[dict], products: list[WeightProducts],
                          peak: FmaPeak) -> None:
    """Beside each one-thread cell's whole prefill (``shares``, print_fractions' result):
    lmc's weight products alone, streamed and cached, against the peak. The prefill does the
    products and more (attention, norms), so the products' streamed share bounds what the
    whole prefill can reach with these kernels."""
    print("\nlmc's weight products alone (bench/c/matmul_rate.c: the same matmul calls, a "
          "chunk of tokens through every layer, nothing between them; best of 3 passes)")
    print("| weights | streamed G/CPU-s (of peak) | cached G/CPU-s (of peak) | "
          "the prefill's share of the peak | 1.3x llama-bench needs |")
    print("|---|---|---|---|---|")
    by_wq = {p.wq: p for p in products}
    for share in shares:
        product = by_wq.get(LMC_WQ[share["weights"]])
        if product is None:
            continue
        whole = f"{share['lmc']:.0%}" if share["lmc"] else "–"
        need = f"{1.3 * share['llama_bench']:.0%}" if share["llama_bench"] else "–"
        rates = [f"{rate:.1f} ({rate / peak.gflops:.0%})"
                 for rate in (product.streamed, product.cached)]
        print(f"| {share['weights']} | {rates[0]} | {rates[1]} | {whole} | {need} |")


def print_fractions(cells: list[Cell], ops: float, peak: FmaPeak, lmc_exact: bool) -> list[dict]:
    """Each one-thread cell's operations per CPU second against the level's peak (lmc's only
    when its prefill attention is exact: sparse prefill leaves out most of attention's
    operations); returns each engine's share per cell (None where not measured)."""
    print(f"\nthis host's FMA peak at {peak.isa} ({peak.bits}-bit {peak.simd}): "
          f"{peak.gflops:.1f} GFLOP per CPU second (bench/c/fma_peak.c, best of 5); the prefill: "
          f"{ops / 1e9:.1f} G operations")
    print("| weights | lmc G/CPU-s (of peak) | llama-bench G/CPU-s (of peak) | "
          "1.3x llama-bench needs |")
    print("|---|---|---|---|")
    shares = []
    for cell in cells:
        if cell.threads != 1:
            continue
        lmc_s, llama_s = (statistics.median(v) for v in (cell.lmc_cpu_s, cell.llama_cpu_s))
        rates = [ops / seconds / 1e9 if seconds > 0 else None for seconds in (lmc_s, llama_s)]
        if not lmc_exact:
            rates[0] = None
        shown = [f"{r:.1f} ({r / peak.gflops:.0%})" if r else "– (within the baseline's noise)"
                 for r in rates]
        if not lmc_exact:
            shown[0] = "– (sparse prefill: fewer)"
        need = f"{1.3 * rates[1] / peak.gflops:.0%} of the peak" if rates[1] else "–"
        print(f"| {cell.gguf_type} | {shown[0]} | {shown[1]} | {need} |")
        shares.append({"weights": cell.gguf_type, "isa": peak.isa,
                       "lmc": rates[0] / peak.gflops if rates[0] else None,
                       "llama_bench": rates[1] / peak.gflops if rates[1] else None})
        if cell.gguf_type == "bf16" and peak.dot_bf16_gflops:
            dot = peak.dot_bf16_gflops
            of_dot = [f"{r / dot:.0%}" if r else "–" for r in rates]
            need_dot = f"{1.3 * rates[1] / dot:.0%}" if rates[1] else "–"
            print(f"| bf16, of the bf16 dot-product peak ({dot:.1f}, vdpbf16ps) | {of_dot[0]} | "
                  f"{of_dot[1]} | {need_dot} |")
            shares[-1] |= {"dot_bf16_peak": dot,
                           "lmc_of_dot_bf16": rates[0] / dot if rates[0] else None,
                           "llama_bench_of_dot_bf16": rates[1] / dot if rates[1] else None}
    print("(q8_0 counts an int8 multiply-add as 2 operations too; its AVX2 kernels spend 5 "
          "instructions on 32 products of a row and a token, f32 4)")
    return shares


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens (pp<N>)")
    parser.add_argument("--types", nargs="+", choices=tuple(LMC_WQ), default=["f32", "q8_0"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=QWEN3_06B.layers,
                        help="layers of the 0.6B-shaped model")
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory instead")
    parser.add_argument("--lmc-extra", default="", help="more lmc options, space-separated "
                        "(e.g. '--attn sparse --prefill-attn sparse')")
    parser.add_argument("--no-cpu-baseline", dest="cpu_baseline", action="store_false",
                        help="skip the 8-token baseline processes (no CPU ratios)")
    parser.add_argument("--omp-wait-policy", choices=("active", "passive"), default="active",
                        help="llama.cpp's OpenMP barriers (bench/depth4096.py explains)")
    parser.add_argument("--llama-no-warmup", dest="llama_warmup", action="store_false",
                        help="run llama-bench without its warm-up pass (long prompts)")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    parser.add_argument("--isa", default="v3",
                        help="the instruction-set level both engines are built for "
                        "(devices/isa.py; default %(default)s, the level of the figures in "
                        "docs/performance.md; v4-vnni: AVX-512 with VNNI)")
    parser.add_argument("--rev", help="lmc built from this git revision instead of the working "
                        "tree (a before-and-after pair of runs)")
    args = parser.parse_args(argv)
    if args.prompt <= BASELINE_TOKENS or args.rounds < 1:
        parser.error(f"--prompt must be > {BASELINE_TOKENS} and --rounds >= 1")

    lmc = engine_binary(rev=args.rev, isa=args.isa)
    llama = build_llama_bench(f"{os.uname().machine}:{args.isa}").binary
    model_dir = model_directory(args)
    vocab = Shape.from_model_dir(model_dir).vocab
    prompt = bench_prompt(args.prompt, vocab)
    baseline = bench_prompt(BASELINE_TOKENS, vocab)
    extra = tuple(args.lmc_extra.split())
    ggufs = {t: ensure_converted(model_dir, t) for t in args.types}
    cells = [Cell(t, n) for t in args.types for n in args.threads]
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for cell in cells:
            wq = LMC_WQ[cell.gguf_type]
            order = ("llama", "lmc") if r % 2 == 0 else ("lmc", "llama")
            for who in order:
                if who == "llama":
                    ms, cpu = run_llama(llama, ggufs[cell.gguf_type], args.prompt,
                                        cell.threads, args.omp_wait_policy, args.llama_warmup)
                    base = (run_llama(llama, ggufs[cell.gguf_type], BASELINE_TOKENS,
                                      cell.threads, args.omp_wait_policy, args.llama_warmup)[1]
                            if args.cpu_baseline else cpu)
                    cell.llama_ms.append(ms)
                    passes = 2 if args.llama_warmup else 1  # its warm-up, then the timed pass
                    cell.llama_cpu_s.append((cpu - base) / passes)
                else:
                    ms, cpu = run_lmc(lmc, model_dir, prompt, wq, cell.threads, extra)
                    base = (run_lmc(lmc, model_dir, baseline, wq, cell.threads, extra)[1]
                            if args.cpu_baseline else cpu)
                    cell.lmc_ms.append(ms)
                    cell.lmc_cpu_s.append(cpu - base)
            print(f"  round {r + 1}/{args.rounds} {cell.gguf_type} t{cell.threads}: "
                  f"lmc {cell.lmc_ms[-1]:.0f} ms, llama-bench {cell.llama_ms[-1]:.0f} ms, "
                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    load_after = os.getloadavg()

    print(f"prefill of {args.prompt} tokens (llama-bench pp{args.prompt}), {args.rounds} "
          f"rounds, model {model_dir}, lmc options {list(extra)}, "
          f"OMP_WAIT_POLICY {args.omp_wait_policy}")
    print("| weights | threads | lmc ms (median) | llama-bench ms (median) | ratio llama/lmc, "
          "wall: median [min, max] | ratio, user CPU seconds (1 thread) |")
    print("|---|---|---|---|---|---|")
    for cell in cells:
        cpu = spread(cell.cpu_ratios()) if cell.threads == 1 and args.cpu_baseline else "–"
        print(f"| {cell.gguf_type} (lmc {LMC_WQ[cell.gguf_type]}) | {cell.threads} | "
              f"{statistics.median(cell.lmc_ms):.0f} | {statistics.median(cell.llama_ms):.0f} | "
              f"{spread(cell.ratios())} | {cpu} |")
    peak, shares, products = None, [], []
    if args.cpu_baseline and 1 in args.threads:
        peak = fma_peak(args.isa)
        shape = Shape.from_model_dir(model_dir)
        shares = print_fractions(cells, prefill_ops(shape, args.prompt), peak,
                                 lmc_exact=not sparse_prefill(extra))
        if args.rev is None and not sparse_prefill(extra):  # the working tree's kernels
            binary = matmul_rate_binary(args.isa)
            products = [weight_products(binary, shape, LMC_WQ[t], "--bf16-acts" in extra)
                        for t in args.types]
            print_weight_products(shares, products, peak)
    finish(lmc, (load_before, load_after), args.json,
           {"args": vars(args), "llama_bench": llama,
            "cells": [dataclasses.asdict(c) for c in cells],
            "fma_peak": dataclasses.asdict(peak) if peak else None, "peak_shares": shares,
            "weight_products": [dataclasses.asdict(p) for p in products]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
