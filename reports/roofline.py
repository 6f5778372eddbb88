"""What a board can physically do, against what a figure claims: the share of the roofline.

A decode step at batch size one reads every weight once plus the KV cache, so a decode time
per token implies a read bandwidth: bytes read per token x tokens per second. Its *share* is
that over the board's measured read bandwidth (``bench/c/stream_read.c``, stored by the board's
health check), for working sets beyond the caches (``Limits.read_bound``): a small model's
weights stay in the caches, which read faster than memory, and are not judged (nor is any
working set under ``JUDGED_FROM_BYTES``). A prefill's
share is its matrix operations (2 per weight and token) per second over the board's FMA peak
(``bench/c/fma_peak.c``, per core) times the threads it ran with (the layers' matrices only:
a lower bound too).

The bytes counted are a lower bound (the weights as lmc stores them, the KV cache up to the
prompt only), so a share over ``IMPOSSIBLE`` (110 %: the measurement's own noise and the
bandwidth's) cannot be a real figure: it is flagged ``impossible`` (a measurement bug) and never
used for history or alerts.

Bytes are counted from the model's shape: f32 weights 4 bytes, bf16/f16 2, q8 34 per 32 values
(int8 + a binary16 scale); a q8 KV cache 1 byte + one f32 scale per 32 values; the lm_head
(tied: the embedding matrix) is read in full every token.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

IMPOSSIBLE = 1.10  # a share beyond this is no real figure
CACHE_FACTOR = 1.5  # a buffer read this much faster than the largest one sits in a cache
# A working set smaller than this is never judged against the read bandwidth: it may sit in a
# last-level cache (32 MB per CCD on Zen 5, 96 MB with stacked cache), and which of the health
# check's small buffers read at a cache's pace depends on the load at the time of the check,
# not of the run (a loaded check once made a tiny model's real decode look impossible).
JUDGED_FROM_BYTES = 128 * (1 << 20)

WEIGHT_BYTES = {
    "f32": 4.0,
    "bf16": 2.0,
    "f16": 2.0,
    # lmc q8 weights and GGML q8_0 alike: int8 + one binary16 scale per 32 values
    "q8": 34.0 / 32.0,
    "q8_0": 34.0 / 32.0,
}
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "q8": 1.0 + 4.0 / 32.0,  # lmc's q8 KV cache: int8 + one f32 scale per 32 values
}


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, c: dict[str, Any]) -> Shape:
        """From a Hugging Face config.json (KeyError/TypeError when it is not a Qwen3-like
        decoder's)."""
        return cls(int(c["hidden_size"]), int(c["intermediate_size"]),
                   int(c["num_hidden_layers"]), int(c["num_attention_heads"]),
                   int(c["num_key_value_heads"]),
                   int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]),
                   int(c["vocab_size"]))

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> Shape:
        return cls.from_config(json.loads((model_dir / "config.json").read_text()))

    @property
    def layer_values(self) -> int:
        """Values in the layers' weight matrices (what every prompt token multiplies)."""
        h, d = self.hidden, self.head_dim
        per_layer = (self.heads * d * h * 2  # q_proj, o_proj
                     + self.kv_heads * d * h * 2  # k_proj, v_proj
                     + self.intermediate * h * 3)  # gate, up, down
        return self.layers * per_layer

    @property
    def matrix_values(self) -> int:
        """Values in the weight matrices a decode step reads: the layers' and the lm_head."""
        return self.layer_values + self.vocab * self.hidden


def weight_bytes_per_token(shape: Shape, wq: str) -> float:
    """Bytes of weights one decode step reads: every matrix, the lm_head, norms, one embed row."""
    h, d = shape.hidden, shape.head_dim
    f32_vectors = (shape.layers * (2 * h + 2 * d) + h + h) * 4  # norms, final norm, embed row
    return shape.matrix_values * WEIGHT_BYTES[wq] + f32_vectors


def kv_bytes_per_token(shape: Shape, kv: str, positions: float) -> float:
    """Bytes of K and V read by exact attention over ``positions`` cached positions."""
    return shape.layers * positions * shape.kv_heads * shape.head_dim * 2 * KV_BYTES[kv]


@dataclass(frozen=True)
class Limits:
    """A board's measured limits (its latest health check's, ``db.limits``), None where not
    measured."""

    read_gbps: float | None = None  # from memory
    fma_gflops: float | None = None  # per core
    read_gbps_by_mib: dict[str, float] | None = None  # by buffer size, caches to memory

    def read_bound(self, working_set: float) -> float | None:
        """The fastest a working set of this many bytes can be streamed from memory, in GB/s,
        or None when it is not judged. Only buffers that read at memory's pace count (within
        ``CACHE_FACTOR`` of the largest buffer's, and every larger one too): a working set
        that fits a cache is bounded by the cache, which a sum kernel does not measure
        faithfully. A working set at least as large as the smallest such buffer is bounded by
        the fastest of them no larger than it (noise only lowers a measured bandwidth).
        Working sets under ``JUDGED_FROM_BYTES`` are not judged."""
        if working_set < JUDGED_FROM_BYTES:
            return None
        measured = sorted((float(mib) * (1 << 20), gbps) for mib, gbps in
                          (self.read_gbps_by_mib or {}).items() if gbps > 0)
        if not measured:
            return None
        memory = measured[-1][1]
        from_memory: list[tuple[float, float]] = []
        for size, gbps in reversed(measured):
            if gbps > CACHE_FACTOR * memory:
                break
            from_memory.append((size, gbps))
        fitting = [gbps for size, gbps in from_memory if size <= working_set]
        return max(fitting) if fitting else None


def decode_share(config: dict[str, Any], wq: str | None, kv: str | None,
                 prompt_tokens: float | None, decode_ms: float | None,
                 limits: Limits) -> float | None:
    """The share of the board's read bandwidth (for a working set of the bytes a step reads:
    ``Limits.read_bound``) a decode time per token implies (None when something it needs is
    unknown)."""
    if not decode_ms or decode_ms <= 0:
        return None
    try:
        shape = Shape.from_config(config)
        read = (weight_bytes_per_token(shape, wq or "f32")
                + kv_bytes_per_token(shape, kv or "f32", float(prompt_tokens or 0)))
    except (KeyError, TypeError, ValueError):
        return None
    bound = limits.read_bound(read)
    return None if not bound else read / (decode_ms / 1000.0) / (bound * 1e9)


def prefill_share(config: dict[str, Any], prompt_tokens: float | None,
                  prefill_ms: float | None, threads: int | None,
                  limits: Limits) -> float | None:
    """The share of the board's FMA peak (per core, times ``threads``) a prefill implies."""
    if not prefill_ms or prefill_ms <= 0 or not prompt_tokens or not limits.fma_gflops:
        return None
    try:
        # the layers only: the logits of the last prompt token alone are not counted
        operations = 2.0 * Shape.from_config(config).layer_values * float(prompt_tokens)
    except (KeyError, TypeError, ValueError):
        return None
    return operations / (prefill_ms / 1000.0) / (limits.fma_gflops * 1e9 * max(threads or 1, 1))


def shares_of(config: dict[str, Any] | None, run: Mapping[str, Any],
              limits: Limits) -> dict[str, float | None]:
    """The roofline share of a run's decode time and prefill time (its model's config.json,
    its axes ``wq``, ``kv``, ``threads`` and figures ``prompt_tokens``,
    ``decode_ms_per_token``, ``prefill_ms``): metric -> share, None where not judged."""
    def known(name: str) -> Any:
        value = run.get(name)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) \
            else value

    def text(name: str) -> str | None:
        value = known(name)
        return value if isinstance(value, str) else None

    config = config if isinstance(config, dict) else {}
    return {"decode_ms_per_token": decode_share(config, text("wq"), text("kv"),
                                                known("prompt_tokens"),
                                                known("decode_ms_per_token"), limits),
            "prefill_ms": prefill_share(config, known("prompt_tokens"), known("prefill_ms"),
                                        known("threads"), limits)}


SHARED = ("decode_ms_per_token", "prefill_ms")  # the figures a share is computed for


def shares_frame(rows: pd.DataFrame, limits: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``shares_of`` for every row at once (runs with their ``device``, ``model_config``, axes
    and figures; ``limits``: ``Store.board_limits``): a frame on the rows' index with a column
    per figure of ``SHARED``, NaN where not judged. The shapes are read once per model config
    and the read bounds once per board and working set; the rest is column arithmetic."""
    out = pd.DataFrame(float("nan"), index=rows.index, columns=list(SHARED))
    if rows.empty or "model_config" not in rows or "device" not in rows or not limits:
        return out

    def column(name: str) -> pd.Series:
        return rows[name] if name in rows else pd.Series(None, index=rows.index, dtype=object)

    def number(name: str) -> pd.Series:
        return pd.to_numeric(column(name), errors="coerce").astype(float)

    configs = column("model_config")
    per_model: dict[int, tuple[float, ...]] = {}  # id(config) -> its shape's counts
    for config in {id(c): c for c in configs}.values():
        try:
            shape = Shape.from_config(config if isinstance(config, dict) else {})
        except (KeyError, TypeError, ValueError):
            per_model[id(config)] = (math.nan,) * 4
            continue
        h, d = shape.hidden, shape.head_dim
        per_model[id(config)] = (
            float(shape.matrix_values), float((shape.layers * (2 * h + 2 * d) + h + h) * 4),
            float(shape.layers * shape.kv_heads * shape.head_dim * 2), float(shape.layer_values))
    counts = pd.DataFrame([per_model[id(c)] for c in configs], index=rows.index,
                          columns=["matrix", "vectors", "kv_per_position", "layer_values"])
    prompt = number("prompt_tokens")
    read = (counts["matrix"] * column("wq").fillna("f32").map(WEIGHT_BYTES).astype(float)
            + counts["vectors"]
            + counts["kv_per_position"] * prompt.fillna(0.0)
            * column("kv").fillna("f32").map(KV_BYTES).astype(float))
    boards = {str(device): limits_of(limits.get(str(device))) for device in set(rows["device"])}
    pairs = pd.DataFrame({"device": rows["device"].astype(str), "read": read})
    bounds = {(device, size): boards[device].read_bound(size) or math.nan
              for device, size in pairs.dropna().drop_duplicates().itertuples(index=False)}
    bound = pd.Series([bounds.get(key, math.nan)
                       for key in zip(pairs["device"], read, strict=True)],
                      index=rows.index, dtype=float)
    decode = number("decode_ms_per_token").where(lambda ms: ms > 0)
    out["decode_ms_per_token"] = read / (decode / 1000.0) / (bound * 1e9)
    peak = pairs["device"].map({d: b.fma_gflops or math.nan for d, b in boards.items()})
    threads = number("threads").fillna(1.0).clip(lower=1.0)
    prefill = number("prefill_ms").where(lambda ms: ms > 0)
    operations = 2.0 * counts["layer_values"] * prompt.where(lambda n: n != 0)
    out["prefill_ms"] = operations / (prefill / 1000.0) / (peak.astype(float) * 1e9 * threads)
    return out


def limits_of(stored: Mapping[str, Any] | None) -> Limits:
    """A board's ``Limits`` from what ``Store.board_limits`` holds for it."""
    stored = stored or {}
    return Limits(stored.get("read_gbps"), stored.get("fma_gflops"),
                  stored.get("read_gbps_by_mib"))


def share_text(share: float | None) -> str:
    if share is None:
        return "not judged"
    return f"{100 * share:.0f} %" + (" IMPOSSIBLE" if share > IMPOSSIBLE else "")


def roofline_table(runs: pd.DataFrame, model_configs: Mapping[str, dict[str, Any]],
                   limits: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per device and config of an experiment's ok runs (``reports.runs.flatten_runs``): the
    median share of the board's roofline of the decode and prefill times, and how many runs
    are beyond ``IMPOSSIBLE`` (empty when no board has measured limits)."""
    columns = ["device", "config", "runs", "decode_share", "prefill_share", "impossible"]
    if not limits or runs.empty or "model_sha256" not in runs:
        return pd.DataFrame(columns=columns)
    ok = runs[runs["status"] == "ok"]
    # every run's shares at once (a run at a time: 11 of a 5,000-run report's 28 s, cProfile)
    shares = shares_frame(ok.assign(model_config=ok["model_sha256"].map(
        lambda sha: model_configs.get(str(sha)))), limits)
    cells = pd.DataFrame({"device": ok["device"], "config": ok["config"],
                          "decode": shares["decode_ms_per_token"], "prefill": shares["prefill_ms"],
                          "beyond": (shares > IMPOSSIBLE).any(axis=1)})
    rows = []
    for (device, config), cell in cells.groupby(["device", "config"], sort=True):
        decode, prefill = cell["decode"].dropna().tolist(), cell["prefill"].dropna().tolist()
        rows.append([device, config, len(cell), statistics.median(decode) if decode else None,
                     statistics.median(prefill) if prefill else None, int(cell["beyond"].sum())])
    return pd.DataFrame(rows, columns=columns)
