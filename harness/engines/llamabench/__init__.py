"""llama.cpp's ``llama-bench`` as the second engine on the farm.

A run is one ``llama-bench -o json`` invocation on a board: a ``decode`` workload point
(``ctx`` prompt tokens, ``max_new`` generated tokens) becomes the tests ``pp<ctx>`` and
``tg<max_new>`` (and ``pp<ctx>+tg<max_new>`` with ``pg = true``), each repeated
``repetitions`` times inside the process after llama-bench's own warm-up. Every repetition's
``samples_ns`` and the build facts llama-bench prints (build_commit, build_number, cpu_info,
backends ...) are kept verbatim in the run's outcome; ``prefill_ms`` is the pp test's mean and
``decode_ms_per_token`` the tg test's mean divided by its tokens, so that reports put the runs
beside lmc's.

Note what the tests time: ``tg`` generates from a context of ``depth`` tokens (0 by default,
llama-bench's convention and that of the published tables), whereas an lmc decode run's steps
follow its ``ctx``-token prompt; set ``depth`` to the ctx to time llama.cpp's decode there.

The model is GGUF: the spec's Hugging Face model converted by :mod:`harness.engines.gguf`
(cached under ``build/gguf``, identified by the GGUF file's sha256) or a GGUF file named in the
``[llama-bench]`` section.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import REPO_ROOT
from harness.build import BuildRecord, sha256_file
from harness.engines.base import Artifact, Measurements
from harness.engines.llamacpp_build import PYPI, build_llama_bench
from harness.spec_check import SpecChecker

NAME = "llama-bench"
GGUF_TYPES = ("f32", "q8_0", "bf16")
# the cache types this llama-bench accepts for -ctk/-ctv (it refuses f32: "invalid parameter")
CACHE_TYPES = ("f16", "q8_0")
# lmc's name for the same weight format (so that report labels line up)
LMC_WQ = {"f32": "f32", "q8_0": "q8", "bf16": "bf16"}
# The fields of a llama-bench JSON row that describe the build and machine, not the test.
BUILD_FIELDS = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends")


SECTION = "llama-bench"  # the spec's table for this engine
SECTION_KEYS = {"source", "rev", "gguf", "gguf_type", "threads", "repetitions", "depth",
                "cache_type", "pg"}


@dataclass(frozen=True)
class LlamaBenchAxes:
    """The spec's ``[llama-bench]`` table: where llama.cpp comes from, and its axes."""

    source: str  # "pypi" or a llama.cpp source tree / git repository
    rev: str | None  # a git revision of ``source``
    gguf: Path | None  # a GGUF file instead of converting the spec's model
    gguf_type: list[str]
    threads: list[int] | None  # None: each device's own `threads`
    repetitions: int
    depth: list[int]
    cache_type: list[str]
    pg: bool

    def configs(self, default_threads: int) -> list[LlamaBenchConfig]:
        return [LlamaBenchConfig(t, n, self.repetitions, d, c, self.pg)
                for t in self.gguf_type for n in self.threads or [default_threads]
                for d in self.depth for c in self.cache_type]


def parse_section(check: SpecChecker, value: Any, spec_dir: Path) -> LlamaBenchAxes:
    """Validate the ``[llama-bench]`` table with the spec's checker (errors name the key)."""
    table = check.table(value, SECTION, SECTION_KEYS)
    source = check.scalar(table.get("source", PYPI), f"{SECTION}.source", "str")
    if source != PYPI:
        source = str((spec_dir / source).resolve())
    rev = table.get("rev")
    if rev is not None:
        rev = check.scalar(rev, f"{SECTION}.rev", "str")
        if source == PYPI:
            raise check.fail(f"{SECTION}.rev", "needs `source` to name a git repository of "
                             "llama.cpp (the pypi sdist has one version)")
    gguf = None
    if "gguf" in table:
        gguf = (spec_dir / check.scalar(table["gguf"], f"{SECTION}.gguf", "str")).resolve()
        if not gguf.is_file():
            raise check.fail(f"{SECTION}.gguf", f"{gguf} is not a file")
        if "gguf_type" in table and isinstance(table["gguf_type"], list):
            raise check.fail(f"{SECTION}.gguf_type", "one type only with `gguf` (the file's)")
    threads = None
    if "threads" in table:
        threads = check.axis(table["threads"], f"{SECTION}.threads", "int", low=1)
    return LlamaBenchAxes(
        source=source, rev=rev, gguf=gguf,
        gguf_type=check.axis(table.get("gguf_type", "f32"), f"{SECTION}.gguf_type", "str",
                             choices=GGUF_TYPES),
        threads=threads,
        repetitions=check.minimum(check.scalar(table.get("repetitions", 5),
                                               f"{SECTION}.repetitions", "int"),
                                  f"{SECTION}.repetitions", 1),
        depth=check.axis(table.get("depth", 0), f"{SECTION}.depth", "int", low=0),
        cache_type=check.axis(table.get("cache_type", "f16"), f"{SECTION}.cache_type", "str",
                              choices=CACHE_TYPES),
        pg=check.scalar(table.get("pg", False), f"{SECTION}.pg", "bool"),
    )


@dataclass(frozen=True)
class LlamaBenchConfig:
    """One point of the ``[llama-bench]`` axes; its ``as_dict`` goes into run keys."""

    gguf_type: str
    threads: int
    repetitions: int
    depth: int
    cache_type: str
    pg: bool
    engine: str = NAME

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def wq(self) -> str:
        return LMC_WQ[self.gguf_type]

    @property
    def kv(self) -> str:
        return self.cache_type


def bench_test_name(row: dict[str, Any]) -> str:
    """llama-bench's own names: pp512, tg128, pp512+tg128; ``@d<n>`` at a depth."""
    n_prompt, n_gen, depth = (int(row.get(k) or 0) for k in ("n_prompt", "n_gen", "n_depth"))
    parts = ([f"pp{n_prompt}"] if n_prompt else []) + ([f"tg{n_gen}"] if n_gen else [])
    return "+".join(parts) + (f" @ d{depth}" if depth else "")


def options(ctx: int, max_new: int, config: LlamaBenchConfig) -> tuple[str, ...]:
    """llama-bench's flags for one decode workload point (without -m, a device path)."""
    opts = ["-p", str(ctx), "-n", str(max_new), "-d", str(config.depth),
            "-r", str(config.repetitions), "-t", str(config.threads),
            "-ctk", config.cache_type, "-ctv", config.cache_type, "-o", "json"]
    if config.pg:
        opts += ["-pg", f"{ctx},{max_new}"]
    return tuple(opts)


class LlamaBenchEngine:
    name = NAME

    def __init__(self, source: str = PYPI, rev: str | None = None,
                 gguf_dir: Path | None = None) -> None:
        self.source, self.rev = source, rev
        self.gguf_dir = gguf_dir or REPO_ROOT / "build" / "gguf"

    def build(self, target: str, revision: str | None = None) -> BuildRecord:
        # llama.cpp's revision is its own (source/rev of the spec section), not lmc's
        return build_llama_bench(target, self.source, self.rev)

    def artifact(self, model_dir: Path | None, gguf_type: str,
                 gguf_file: Path | None = None) -> Artifact:
        """The GGUF a run reads: ``gguf_file`` as given, or ``model_dir`` converted."""
        from harness.engines.gguf import ensure_converted

        if gguf_file is None:
            assert model_dir is not None  # the spec check demands a model or a gguf
            source_sha = sha256_file(model_dir / "model.safetensors")
            out = self.gguf_dir / f"{model_dir.name}-{source_sha[:16]}-{gguf_type}.gguf"
            gguf_file = ensure_converted(model_dir, gguf_type, out)
            info = {"format": "gguf", "type": gguf_type, "converted_from": str(model_dir),
                    "safetensors_sha256": source_sha}
        else:
            info = {"format": "gguf", "type": gguf_type}
        return Artifact(gguf_file, sha256_file(gguf_file), info)

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        return [binary, "-m", str(model), *options]

    def parse(self, stdout: str, command: str) -> Any:
        rows = json.loads(stdout)
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "samples_ns" in r
                                                 for r in rows):
            raise ValueError("llama-bench printed no list of tests with samples_ns "
                             "(was it run with -o json?)")
        return rows

    def measurements(self, command: str, data: Any) -> Measurements:
        result = Measurements()
        tests = []
        for row in data:
            n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
            mean_ms = float(row["avg_ns"]) / 1e6
            if n_prompt and not n_gen:
                result.prefill_ms, result.prompt_tokens = mean_ms, n_prompt
            elif n_gen and not n_prompt:
                result.decode_ms_per_token = mean_ms / n_gen
            tests.append({"test": bench_test_name(row)}
                         | {k: v for k, v in row.items() if k not in BUILD_FIELDS})
        build = {k: data[0].get(k) for k in BUILD_FIELDS} if data else {}
        result.extra = {"llama_bench": {"tests": tests, "build": build}}
        return result

    def health_argv(self, binary: str) -> list[str]:
        return [binary, "--version"]

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        """``llama-bench --version`` prints its version and build on stderr ("version: ...")."""
        first = stderr.strip().splitlines()[0] if stderr.strip() else ""
        return first.startswith("version:"), first or "printed nothing on stderr"
