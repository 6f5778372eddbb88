"""lmc against llama.cpp: decode tokens/s on the same model, threads, prompt and decode length.

The model is the Qwen3-0.6B-shaped random model (``bench/qwen3_06b.py``); lmc reads its HF
directory, llama.cpp (through llama-cpp-python, ``pip install -e .[bench]``) reads the same
weights converted by ``bench/gguf_convert.py``: f32 against lmc ``--wq f32`` and q8_0 against
``--wq q8``. For every context window (``--ctx``: lmc ``--ctx``, llama.cpp ``n_ctx``) and format,
the two engines run alternately (ABBA order) ``--repeats`` times; a figure is the median.

Both sides time the same thing: the forward pass of one decode step including the logits, from
the engine's own clock for lmc (``decode_ms_per_token``, the median step) and a wall clock
around ``llama_decode`` for llama.cpp (median step). Greedy argmax is outside both timings.
KV caches are f32 on both sides by default (``--llama-kv f16`` for llama.cpp's default).
llama.cpp's CPU threads meet at an OpenMP barrier after every operation. By default they spin
there (``OMP_WAIT_POLICY=active``, OpenMP's and llama.cpp's own choice, and its fastest on a
quiet machine); each llama.cpp run is a child process of its own, so its idle spinning threads
are gone before lmc runs. On a loaded machine a spinning barrier waits out whole scheduler
time slices whenever the partner thread is preempted (measured here: 8 s instead of 60 ms per
token at 2 threads and load 10): ``--omp-wait-policy passive`` makes them sleep.
The generated tokens are compared too: with the same weights the two engines should agree
until rounding differences flip an argmax.

    .venv/bin/python bench/vs_llamacpp.py                    # ctx 512 and 4096, f32 and q8_0
    .venv/bin/python bench/vs_llamacpp.py --ctx 512 --types q8_0 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf_convert import ensure_converted
from qwen3_06b import generate as generate_model
from roofline import (
    Shape,
    bench_prompt,
    decode_bytes,
    engine_binary,
    environment,
    run_lmc_generate,
    stream_ceiling,
)

# GGUF type -> the lmc weight format it is compared to
LMC_WQ = {"f32": "f32", "q8_0": "q8", "bf16": "bf16"}


class LlamaRunner:
    """One llama.cpp model + context, driven through the low-level API token by token."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int, kv: str, flash_attn: bool):
        import llama_cpp

        self.lib = llama_cpp
        kv_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[kv]
        self.llm = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, type_k=kv_type, type_v=kv_type, flash_attn=flash_attn,
            n_gpu_layers=0, verbose=False,
        )
        self.ctx = self.llm.ctx
        self.n_vocab = self.llm.n_vocab()

    def _decode(self, tokens: list[int]) -> None:
        array = (self.lib.llama_token * len(tokens))(*tokens)
        rc = self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(array, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax_last(self) -> int:
        logits = self.lib.llama_get_logits_ith(self.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    def generate(self, prompt: list[int], max_new: int) -> dict:
        """Prefill ``prompt`` in one batch, then ``max_new`` single-token decode steps."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        self.lib.llama_perf_context_reset(self.ctx)
        t0 = time.perf_counter()
        self._decode(prompt)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        tokens, steps = [], []
        for _ in range(max_new):
            token = self._argmax_last()
            tokens.append(token)
            t1 = time.perf_counter()
            self._decode([token])
            steps.append((time.perf_counter() - t1) * 1e3)
        perf = self.lib.llama_perf_context(self.ctx)
        return {"prefill_ms": prefill_ms, "tokens": tokens, "steps_ms": steps,
                "decode_ms_per_token": statistics.median(steps),
                "internal_eval_ms_per_token": perf.t_eval_ms / max(perf.n_eval, 1)}

    def close(self) -> None:
        self.llm.close()


def llama_generate(gguf: Path, n_ctx: int, threads: int, kv: str, flash_attn: bool,
                   prompt: list[int], max_new: int) -> dict:
    """One llama.cpp run: load, generate, close (in the child process of run_llama_isolated)."""
    runner = LlamaRunner(gguf, n_ctx, threads, kv, flash_attn)
    try:
        return runner.generate(prompt, max_new)
    finally:
        runner.close()


def run_llama_isolated(*args: Any) -> dict:
    """llama_generate in a child process that exits when it is done. With OMP_WAIT_POLICY=active
    idle OpenMP threads spin for as long as their process lives: run in this process, they kept
    both cores busy while lmc, the next run, was being timed (lmc 56-65 ms/token instead of
    33-54)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(llama_generate, *args).result()


@dataclass
class Comparison:
    ctx: int
    gguf_type: str
    lmc_wq: str
    threads: int
    prompt_len: int
    decode: int
    lmc_ms: list[float] = field(default_factory=list)
    llama_ms: list[float] = field(default_factory=list)
    llama_internal_ms: list[float] = field(default_factory=list)
    lmc_prefill_ms: list[float] = field(default_factory=list)
    llama_prefill_ms: list[float] = field(default_factory=list)
    agree: int = -1  # leading generated tokens the two engines agree on (first run)
    lmc_bytes: float = 0.0  # bytes one decode step reads (weights + mean KV), each engine's format
    llama_bytes: float = 0.0

    def tokens_per_s(self, ms: list[float]) -> float:
        return 1e3 / statistics.median(ms)

    def gbps(self, ms: list[float], nbytes: float) -> float:
        return nbytes / (statistics.median(ms) / 1e3) / 1e9

    @property
    def ratio(self) -> float:
        """lmc decode speed / llama.cpp decode speed (> 1: lmc is faster)."""
        return statistics.median(self.llama_ms) / statistics.median(self.lmc_ms)


def leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(lmc: Path, model_dir: Path, gguf: Path, gguf_type: str, ctx: int, prompt: list[int],
            decode: int, threads: int, repeats: int, llama_kv: str, flash_attn: bool) -> Comparison:
    row = Comparison(ctx, gguf_type, LMC_WQ[gguf_type], threads, len(prompt), decode)
    shape = Shape.from_model_dir(model_dir)
    row.lmc_bytes = decode_bytes(shape, row.lmc_wq, "f32", len(prompt), decode)
    row.llama_bytes = decode_bytes(shape, gguf_type, llama_kv, len(prompt), decode)
    for r in range(repeats):
        def run_lmc() -> list[int]:
            doc = run_lmc_generate(lmc, model_dir, prompt, decode, threads, row.lmc_wq, "f32",
                                   ctx=ctx)
            row.lmc_ms.append(doc["decode_ms_per_token"])
            row.lmc_prefill_ms.append(doc["prefill_ms"])
            return doc["tokens"]

        def run_llama() -> list[int]:
            doc = run_llama_isolated(gguf, ctx, threads, llama_kv, flash_attn, prompt, decode)
            row.llama_ms.append(doc["decode_ms_per_token"])
            row.llama_internal_ms.append(doc["internal_eval_ms_per_token"])
            row.llama_prefill_ms.append(doc["prefill_ms"])
            return doc["tokens"]

        # ABBA: whoever runs second in a pair gets a warmer page cache; alternate it
        if r % 2 == 0:
            lmc_tokens, llama_tokens = run_lmc(), run_llama()
        else:
            llama_tokens, lmc_tokens = run_llama(), run_lmc()
        if r == 0:
            row.agree = leading_agreement(lmc_tokens, llama_tokens)
        print(f"  ctx {ctx} {gguf_type} run {r + 1}/{repeats}: lmc {row.lmc_ms[-1]:.1f} ms, "
              f"llama.cpp {row.llama_ms[-1]:.1f} ms per token", file=sys.stderr)
    return row


def markdown_table(rows: list[Comparison], stream_gbps: float) -> str:
    lines = [
        "| ctx | weights (lmc / llama.cpp) | lmc tok/s | llama.cpp tok/s | ratio lmc/llama.cpp "
        "| lmc GB/s (of STREAM) | llama.cpp GB/s (of STREAM) "
        "| lmc prefill tok/s | llama.cpp prefill tok/s | tokens agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lmc_gbps, llama_gbps = r.gbps(r.lmc_ms, r.lmc_bytes), r.gbps(r.llama_ms, r.llama_bytes)
        lines.append(
            f"| {r.ctx} | {r.lmc_wq} / {r.gguf_type} | {r.tokens_per_s(r.lmc_ms):.2f} "
            f"| {r.tokens_per_s(r.llama_ms):.2f} | {r.ratio:.2f} "
            f"| {lmc_gbps:.1f} ({lmc_gbps / stream_gbps:.0%}) "
            f"| {llama_gbps:.1f} ({llama_gbps / stream_gbps:.0%}) "
            f"| {r.prompt_len * 1e3 / statistics.median(r.lmc_prefill_ms):.1f} "
            f"| {r.prompt_len * 1e3 / statistics.median(r.llama_prefill_ms):.1f} "
            f"| {r.agree}/{r.decode} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--types", nargs="+", choices=tuple(LMC_WQ), default=["f32", "q8_0"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--llama-kv", choices=("f32", "f16"), default="f32")
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp flash attention")
    parser.add_argument("--omp-wait-policy", choices=("passive", "active", "inherit"),
                        default="active", help="llama.cpp's OpenMP barriers (see above)")
    parser.add_argument("--rev", help="build lmc from this git revision (default: work tree)")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    args = parser.parse_args(argv)
    if args.omp_wait_policy != "inherit":  # read once, when libgomp loads with llama_cpp
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("vs_llamacpp: error: llama-cpp-python is not installed; run "
              "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" .venv/bin/pip install -e '.[bench]'",
              file=sys.stderr)
        return 2
    for ctx in args.ctx:
        if ctx < args.prompt_len + args.decode:
            print(f"vs_llamacpp: error: --ctx {ctx} is smaller than --prompt-len + --decode "
                  f"({args.prompt_len + args.decode})", file=sys.stderr)
            return 2

    lmc = engine_binary(args.rev)
    model_dir = generate_model(dtypes=("BF16",))["BF16"]
    shape = Shape.from_model_dir(model_dir)
    prompt = bench_prompt(args.prompt_len, shape.vocab)
    ggufs = {t: ensure_converted(model_dir, t) for t in args.types}
    env = environment(lmc)
    env["engine_rev"] = args.rev or "worktree"
    try:
        import importlib.metadata as md
        env["llama_cpp_python"] = md.version("llama-cpp-python")
    except Exception:  # noqa: BLE001 - a version string is informational only
        env["llama_cpp_python"] = "unknown"
    import llama_cpp

    env["llama_cpp_system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    # STREAM before and after: the machine is shared, so keep the best figure
    bandwidths = stream_ceiling(args.threads)
    rows = [compare(lmc, model_dir, ggufs[t], t, ctx, prompt, args.decode, args.threads,
                    args.repeats, args.llama_kv, args.flash_attn)
            for ctx in args.ctx for t in args.types]
    bandwidths += stream_ceiling(args.threads)
    stream = max(b.gbps_best for b in bandwidths)
    print(markdown_table(rows, stream))
    print(f"\nSTREAM read, best pass (threads), before then after: "
          f"{', '.join(f'{b.gbps_best:.2f} ({b.threads})' for b in bandwidths)} GB/s")
    print(f"\nthreads {args.threads}, prompt {args.prompt_len}, decode {args.decode}, "
          f"repeats {args.repeats}, llama.cpp KV {args.llama_kv}, flash-attn {args.flash_attn}, "
          f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"environment: {json.dumps(env)}")
    print(f"loadavg after: {[round(x, 2) for x in os.getloadavg()]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "environment": env, "args": vars(args), "bandwidth": [asdict(b) for b in bandwidths],
            "rows": [asdict(r) for r in rows]}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
