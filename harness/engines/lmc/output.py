"""The engine's stdout is untrusted: check it against the `lmc/1` schema before anyone uses it.

A board (or whatever its ``exec_prefix`` runs) can print anything: another program's output, a
truncated document, numbers no column can hold, or hundreds of megabytes. ``parse`` runs in the
board's runner actor, on the device side of Ray, and turns the engine's stdout into a document
whose every field the driver reads has the type and range the store expects; anything else
raises ``EngineOutputError`` with a reason a user can act on, and the run is stored as
``failed`` with that reason. The schema is the one engine/README.md documents; fields the
harness does not read (``config``, ``stop_reason`` ...) are only required to be there when the
harness relies on them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from devices.transport import Transport
from harness.contract import OutputRefused

SCHEMA = "lmc/1"
# The largest document accepted. A `generate` of thousands of tokens with --measure-selection
# prints about 250 bytes per step; 16 MiB leaves room for far longer runs than any workload.
MAX_STDOUT_CHARS = 16 * 1024 * 1024
# Token ids are int32 in the engine and u32 in tokenizers; ids at or above this are nonsense.
MAX_TOKEN_ID = 2**31 - 1
# Counts (tokens, bytes) must fit the store's 64-bit integer columns.
MAX_COUNT = 2**63 - 1


class EngineOutputError(OutputRefused):
    """The engine's stdout is not a valid `lmc/1` document for the command that was run."""


def _refuse_constant(name: str) -> float:
    raise EngineOutputError(f"lmc printed {name}, which is not a JSON number")


def parse(stdout: str, command: str) -> dict[str, Any]:
    """The engine's document for ``command`` (generate | ppl | attn-bench), checked."""
    if len(stdout) > MAX_STDOUT_CHARS:
        raise EngineOutputError(f"lmc printed {len(stdout)} characters on stdout, more than "
                                f"the {MAX_STDOUT_CHARS} an engine document may have")
    try:
        doc = json.loads(stdout, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise EngineOutputError(f"lmc printed no valid JSON ({exc}): {stdout[:200]!r}"
                                ) from None
    except RecursionError:
        raise EngineOutputError("lmc printed JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise EngineOutputError(f"lmc printed a JSON {type(doc).__name__}, not an object "
                                f"(the {SCHEMA} document): {stdout[:200]!r}")
    if doc.get("schema") != SCHEMA:
        raise EngineOutputError(f"output field 'schema': expected {SCHEMA!r}, "
                                f"got {_show(doc.get('schema'))}")
    if doc.get("command") != command:
        raise EngineOutputError(f"output field 'command': expected {command!r} (the command "
                                f"that was run), got {_show(doc.get('command'))}")
    CHECKS[command](doc)
    return doc


def _show(value: Any) -> str:
    text = "nothing" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(path: str, allowed: str, value: Any) -> EngineOutputError:
    return EngineOutputError(f"output field {path!r}: must be {allowed}, got {_show(value)}")


def _number(value: Any, path: str, optional: bool = False) -> None:
    """A finite, non-negative JSON number (never a bool, never a string); None if optional."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, "a number", value)
    if not (math.isfinite(value) and 0 <= value <= 1e300):
        raise _fail(path, "a finite number >= 0", value)


def _count(value: Any, path: str, high: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise _fail(path, f"an integer from 0 to {high}", value)


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise _fail(key, "a list", value)
    return value


def _selection(value: Any, path: str) -> None:
    """The optional ``selection`` figures: byte counts and diagnostics, all numbers."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _fail(path, "an object", value)
    for key, figure in value.items():
        _number(figure, f"{path}.{key}")
    for key in ("select_bytes", "kv_bytes", "bytes_read"):
        if key in value:
            _count(value[key], f"{path}.{key}")


KV_MEMORY_COUNTS = ("block_bytes", "allocated_bytes", "resident_bytes", "live_bytes",
                    "peak_live_bytes")


def _memory(doc: dict[str, Any]) -> None:
    """The optional ``kv_memory`` object (byte counts, ``paged``), ``peak_rss_kb`` and
    ``weights_bytes``."""
    memory = doc.get("kv_memory")
    if memory is not None:
        if not isinstance(memory, dict) or not isinstance(memory.get("paged"), bool):
            raise _fail("kv_memory", "an object with a boolean 'paged'", memory)
        for key in KV_MEMORY_COUNTS:
            _count(memory.get(key), f"kv_memory.{key}")
    for key in ("peak_rss_kb", "weights_bytes"):
        if doc.get(key) is not None:
            _count(doc[key], key)


def _vocab_limit(doc: dict[str, Any]) -> int:
    """Token ids must lie below the model's vocabulary when the document states it."""
    config = doc.get("config")
    model = config.get("model_config") if isinstance(config, dict) else None
    vocab = model.get("vocab_size") if isinstance(model, dict) else None
    if isinstance(vocab, int) and not isinstance(vocab, bool) and 0 < vocab <= MAX_TOKEN_ID:
        return vocab - 1
    return MAX_TOKEN_ID


def _generate(doc: dict[str, Any]) -> None:
    _count(doc.get("prompt_tokens"), "prompt_tokens")
    _number(doc.get("prefill_ms"), "prefill_ms")
    _number(doc.get("decode_ms_per_token"), "decode_ms_per_token", optional=True)
    _number(doc.get("attn_ms_per_token"), "attn_ms_per_token", optional=True)
    for key in ("prefill_cpu_ms", "decode_cpu_ms_per_token"):  # lmc builds before 2026-12-05
        _number(doc.get(key), key, optional=True)                # have neither
    highest = _vocab_limit(doc)
    tokens = _list(doc, "tokens")
    for i, token in enumerate(tokens):
        _count(token, f"tokens[{i}]", highest)
    steps = _list(doc, "steps")
    if len(steps) != len(tokens):
        raise EngineOutputError(f"output fields 'tokens' and 'steps': one step per generated "
                                f"token expected, got {len(tokens)} tokens and "
                                f"{len(steps)} steps")
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        if not isinstance(step, dict):
            raise _fail(where, "an object", step)
        if step.get("token") != tokens[i]:
            raise _fail(f"{where}.token", f"the generated token {tokens[i]}", step.get("token"))
        _number(step.get("ms"), f"{where}.ms")
        _number(step.get("attn_ms"), f"{where}.attn_ms", optional=True)
        _selection(step.get("selection"), f"{where}.selection")
    _selection(doc.get("selection"), "selection")
    _memory(doc)


def _ppl(doc: dict[str, Any]) -> None:
    _count(doc.get("tokens"), "tokens")
    _number(doc.get("nll"), "nll")
    _number(doc.get("ppl"), "ppl")
    _memory(doc)
    ranking = doc.get("key_ranking")
    if ranking is not None:
        if not isinstance(ranking, dict):
            raise _fail("key_ranking", "an object", ranking)
        _count(ranking.get("every"), "key_ranking.every")
        layers = ranking.get("layers")
        if not isinstance(layers, list):
            raise _fail("key_ranking.layers", "a list", layers)
        _key_ranking(ranking, "key_ranking")
        for i, part in enumerate(layers):
            _key_ranking(part, f"key_ranking.layers[{i}]")


RANKING_FIGURES = ("rho", "recall32", "captured32", "lost50", "lost_keep")
# the eviction-prediction article's two-stage candidates in the last 128 keys (engine/keyrank.h),
# over cand_queries
CANDIDATE_FIGURES = ("recall32_c32", "recall32_c48", "recall32_c64", "recall32_c96",
                     "kept32_c96")
# each figure's query count: the candidates' over the 128-key universes, direct's over queries
# with 2 D keys or more (lmc --measure-keys-direct D)
FIGURE_COUNTS = dict.fromkeys(RANKING_FIGURES, "queries") | \
    dict.fromkeys(CANDIDATE_FIGURES, "cand_queries") | {"recall32_direct": "direct_queries"}


def _key_ranking(part: Any, path: str) -> None:
    """--measure-keys figures: the query counts, rho in [-1, 1], the shares in [0, 1] (null
    when no query had enough keys for them)."""
    if not isinstance(part, dict):
        raise _fail(path, "an object", part)
    _count(part.get("queries"), f"{path}.queries")
    for count in set(FIGURE_COUNTS.values()) - {"queries"}:
        _count(part.get(count), f"{path}.{count}")
    for key, count in FIGURE_COUNTS.items():
        value = part.get(key)
        if value is None and part[count] == 0:
            continue
        low = -1 if key == "rho" else 0
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not low - 1e-9 <= value <= 1 + 1e-9:
            raise _fail(f"{path}.{key}", f"a number from {low} to 1", value)


def _attn_bench(doc: dict[str, Any]) -> None:
    _count(doc.get("ctx"), "ctx")
    _number(doc.get("ms"), "ms")
    for i, value in enumerate(_list(doc, "runs")):
        _number(value, f"runs[{i}]")
    _selection(doc.get("selection"), "selection")


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "generate": _generate, "ppl": _ppl, "attn-bench": _attn_bench,
}


# --trace-selection: the engine writes the selected blocks into a file in the device's workdir
# (a fixed name: a board runs one order at a time), which is fetched, checked and removed.
TRACE_FLAG = "--trace-selection"
TRACE_FILE = "benchfarm-selection-trace.txt"
TRACE_KEY = "selection_trace"  # where the fetched trace joins the engine's document
MAX_TRACE_BYTES = 16 * 1024 * 1024


def trace_path(options: tuple[str, ...]) -> str | None:
    """The trace file a run's engine options name, if they ask for one."""
    if TRACE_FLAG not in options:
        return None
    return options[options.index(TRACE_FLAG) + 1]


def fetch_trace(transport: Transport, path: str) -> str:
    """The trace the engine wrote on the device, checked; the file is removed."""
    data = transport.fetch(path)
    transport.run_host(["rm", "-f", path], timeout=30.0)
    return parse_trace(data)


def parse_trace(data: bytes) -> str:
    """The trace text (engine/README.md, Trace): a `#` line, then per decode step, layer and
    query head `query_pos layer head n_selected block_id...`."""
    if len(data) > MAX_TRACE_BYTES:
        raise EngineOutputError(f"the selection trace has {len(data)} bytes, more than the "
                                f"{MAX_TRACE_BYTES} kept with a run")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EngineOutputError("the selection trace is not UTF-8 text") from None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#"):
        raise EngineOutputError("the selection trace does not start with its '#' header line")
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if (len(fields) < 4 or not all(f.isascii() and f.isdigit() for f in fields)
                or int(fields[3]) != len(fields) - 4):
            raise EngineOutputError(f"selection trace line {number}: expected `query_pos layer "
                                    f"head n_selected block_id...`, got {line[:80]!r}")
    return text
