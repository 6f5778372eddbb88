"""Published llama-bench rows as claims: ``[[llama_bench]]`` tables in a claims file.

Tables of llama.cpp's ``llama-bench`` (model, size, params, backend, threads, test, t/s) are how
most CPU figures for boards are published. One row of such a table is one claim::

    [[llama_bench]]
    id = "gemma4-e2b-q8_0-tg128"
    source = "https://github.com/..."          # where the row was published
    model = "gemma4 E2B"                       # llama-bench's model column, without the quant
    quant = "Q8_0"                             # the weights' type as llama-bench prints it
    test = "tg128"                             # ppN (prompt of N tokens) or tgN (N generated)
    tps = 7.67                                 # the t/s column: mean ± sd
    sd = 0.05
    board = "rk3588"                           # the device class it ran on
    threads = 4
    backend = "CPU"                            # optional, default CPU
    build = "b4500 (1d7a2a3)"                  # llama-bench's build line, or what is known
    rel_tolerance = 0.10                       # optional: measured within ±10 % reproduces
                                               # (default: ± 2 sd, the published spread)

The audit runs the same test through the llama-bench adapter (``harness.engines.llamabench``)
on a device of the row's class with the row's threads, on the audit's model converted to the
row's quant, and judges the t/s it measures (from the stored ``samples_ns``) against the row.
A row is "not comparable" when its model is not the audit's model, no real (not emulated)
device of its class is in the inventory, or benchfarm cannot run it as published (a backend
other than the CPU, weights other than F32, Q8_0 or BF16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from devices.checker import Checker

ROW_KEYS = {"id", "source", "model", "quant", "test", "tps", "sd", "board", "threads",
            "backend", "build", "rel_tolerance", "note"}
TEST_RE = re.compile(r"^(pp|tg)([1-9][0-9]{0,5})$")
# llama-bench's type names of the weights benchfarm converts to -> [llama-bench] gguf_type
RUNNABLE_QUANTS = {"F32": "f32", "Q8_0": "q8_0", "BF16": "bf16"}
BACKEND = "CPU"
REPETITIONS = 5  # llama-bench -r: the published tables' default
OTHER_TOKENS = 16  # the other half of a run: a ppN row also runs tg16, a tgN row pp16


@dataclass(frozen=True)
class LlamaBenchRow:
    id: str
    source: str
    model: str
    quant: str
    test: str
    tps: float
    sd: float
    board: str
    threads: int
    backend: str
    build: str
    rel_tolerance: float | None  # None: the published spread, ± 2 sd, is the tolerance
    note: str

    @property
    def experiment(self) -> str:
        return f"llama-bench-{self.id}"

    @property
    def statement(self) -> str:
        return (f"llama-bench {self.test}: {self.tps:g} ± {self.sd:g} t/s for {self.model} "
                f"{self.quant}, {self.threads} threads, {self.backend} on {self.board} "
                f"(build {self.build})")

    def unrunnable(self) -> str | None:
        """Why benchfarm cannot run the row as it was published, or None."""
        if self.backend.upper() != BACKEND:
            return f"llama-bench on its {self.backend} backend (benchfarm runs the CPU's)"
        if self.quant.upper() not in RUNNABLE_QUANTS:
            return (f"llama-bench with {self.quant} weights (benchfarm converts models to "
                    f"{', '.join(RUNNABLE_QUANTS)} only)")
        return None

    def fragment(self) -> dict[str, Any]:
        """The spec fragment of the experiment that runs the row's test on its board."""
        kind, tokens = TEST_RE.match(self.test).groups()  # type: ignore[union-attr]
        ctx, max_new = (int(tokens), OTHER_TOKENS) if kind == "pp" else (OTHER_TOKENS,
                                                                            int(tokens))
        return {"engines": ["llama-bench"], "repeats": 1, "warmups": 0,
                "llama-bench": {"gguf_type": [RUNNABLE_QUANTS[self.quant.upper()]],
                                "threads": [self.threads], "repetitions": REPETITIONS},
                "workload": [{"kind": "decode", "ctx": ctx, "max_new": max_new}]}


def parse_rows(check: Checker, raw_rows: Any, default_source: Any,
               name_re: re.Pattern[str]) -> list[LlamaBenchRow]:
    """Validate ``[[llama_bench]]`` tables with the claims file's checker (errors name the
    file, the row and the key)."""
    if not isinstance(raw_rows, list):
        raise check.at("file").fail("llama_bench", "must be tables [[llama_bench]]")
    rows: list[LlamaBenchRow] = []
    ids: set[str] = set()  # linear in the number of rows
    for index, raw in enumerate(raw_rows):
        row_check = check.at(f"llama_bench #{index + 1}")
        if not isinstance(raw, dict):
            raise row_check.fail("llama_bench", "must be a table")
        if isinstance(raw.get("id"), str) and raw["id"].strip():
            row_check = row_check.at(f"llama_bench '{raw['id'].strip()}'")
        row_check.table(raw, "", ROW_KEYS)
        for key in ("id", "model", "quant", "test", "tps", "sd", "board", "threads", "build"):
            if key not in raw:
                raise row_check.fail(key, "required")
        if "source" not in raw and default_source is None:
            raise row_check.fail("source", "required (here or at the top of the file)")
        row_id = row_check.text(raw["id"], "id")
        if not name_re.match(row_id):
            raise row_check.fail("id", f"{row_id!r}: use [a-z0-9][a-z0-9._-]*")
        if row_id in ids:
            raise row_check.fail("id", "is used by two rows")
        ids.add(row_id)
        test = row_check.text(raw["test"], "test")
        if not TEST_RE.match(test):
            raise row_check.fail("test", f"{test!r}: expected ppN or tgN as llama-bench "
                                 "names its tests (e.g. pp512, tg128)")
        threads = raw["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise row_check.fail("threads", f"must be a whole number >= 1, got {threads!r}")
        rows.append(LlamaBenchRow(
            id=row_id, source=row_check.text(raw.get("source", default_source), "source"),
            model=row_check.text(raw["model"], "model"),
            quant=row_check.text(raw["quant"], "quant"), test=test,
            tps=row_check.number(raw["tps"], "tps", low=0),
            sd=row_check.number(raw["sd"], "sd", low=0),
            board=row_check.text(raw["board"], "board"), threads=threads,
            backend=row_check.text(raw.get("backend", BACKEND), "backend"),
            build=row_check.text(raw["build"], "build"),
            rel_tolerance=(row_check.number(raw["rel_tolerance"], "rel_tolerance", low=0)
                           if "rel_tolerance" in raw else None),
            note=str(raw.get("note", ""))))
    return rows
