"""A spec's ``[llama-bench]`` table: where llama.cpp comes from, and llama-bench's axes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devices.checker import Checker
from harness.engines.llamabench.build import PYPI

NAME = "llama-bench"
SECTION = "llama-bench"  # the spec's table for this engine
SECTION_KEYS = {"source", "rev", "gguf", "gguf_type", "threads", "repetitions", "depth",
                "cache_type", "pg"}
GGUF_TYPES = ("f32", "q8_0", "bf16")
# the cache types this llama-bench accepts for -ctk/-ctv (it refuses f32: "invalid parameter")
CACHE_TYPES = ("f16", "q8_0")
# lmc's name for the same weight format (so that report labels line up)
LMC_WQ = {"f32": "f32", "q8_0": "q8", "bf16": "bf16"}
# its axes stored as the runs' indexed columns (db.records.AXIS_COLUMNS): the cache type as kv,
# the weight format in lmc's names as wq, and the threads
COLUMNS = ("kv", "wq", "threads")


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

    def columns(self) -> dict[str, Any]:
        """The run's axes as the store's columns: no attention policy, lmc's weight names."""
        return {name: getattr(self, name) for name in COLUMNS}


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


def parse_section(check: Checker, value: Any, spec_dir: Path,
                  kinds: list[str]) -> LlamaBenchAxes:
    """Validate the ``[llama-bench]`` table with the spec's checker (errors name the key);
    ``kinds``: the spec's workload kinds (llama-bench runs decode workloads)."""
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
    axes = LlamaBenchAxes(
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
    if "decode" not in kinds:
        raise check.fail("engines", "llama-bench runs decode workloads (pp<ctx>, "
                         "tg<max_new>): add a [[workload]] of kind = \"decode\"")
    return axes
