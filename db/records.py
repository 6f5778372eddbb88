"""Plain records the coordinator fills and hands to :meth:`db.store.Store.save_run`.

They carry no database state: ids of the experiment, device, build, model and workload come from
the ``upsert_*``/``record_build`` methods of the store. Timings are milliseconds, as the engine
prints them. Timestamps are :class:`datetime.datetime` (aware ones are stored as UTC).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

# A measurement (one attempt at a run) is "ok" when the engine finished and its output was
# parsed; "failed" when the engine (or the transport) failed for good; "interrupted" when the
# coordinator stopped while it was in flight; "pending" when no board could run it (a later
# `benchfarm run` finishes it); "cancelled" when `benchfarm cancel` stopped its experiment while
# it was in flight; "running" while it is in flight; "lost" when its coordinator vanished (its
# board lease expired with the attempt still running). A run's status is "ok" when it has an ok
# measurement made under a live lease, else its latest measurement's.
RUN_STATUSES = ("ok", "failed", "interrupted", "pending", "cancelled", "running", "lost")
# an alert's states (db.alerts): a person's triage, and the fix a later step suggests
ALERT_STATES = ("untriaged", "acknowledged", "invalid", "wontfix", "fixed", "fix-suggested")
SNAPSHOT_PHASES = ("before", "after")
# The runs' axis columns (indexed, so that reports group by them): named for lmc's axes, which
# came first; each engine's adapter declares which of its config keys it stores in them
# (``axis_columns``), and leaves the others empty.
AXIS_COLUMNS = ("policy", "k", "block", "probes", "kv", "wq", "threads", "prefill_attn")


@dataclass(frozen=True)
class SeriesStep:
    """A step in one series (device, config, metric) of an experiment's history: the median
    level before and after ``revision``, the first revision at the new level, and their ratio
    (after / before; None when before is 0). ``reports.history.HistoryStep`` judges whether it
    is a regression; ``db.alerts`` stores it with that verdict."""

    revision: str
    device: str
    config: str
    metric: str
    before: float
    after: float
    ratio: float | None


@dataclass
class Figures:
    """The figures every engine reports in the same units, mapped from its output by its
    adapter (``figures``); each is a column of ``measurements`` and a field of
    :class:`RunResult` of the same name.

    Each figure's field names its unit in its metadata: ``FIGURE_UNITS`` reads them, and the
    results mapping, the report's runs.csv and the timings ``compare`` and ``history`` follow
    take their lists from it, so a figure added here reaches all of them.
    """

    prompt_tokens: int | None = field(default=None, metadata={"unit": "tokens"})
    # the whole prompt's forward pass
    prefill_ms: float | None = field(default=None, metadata={"unit": "ms"})
    # one generated token, and attention's share of it where measured
    decode_ms_per_token: float | None = field(default=None, metadata={"unit": "ms per token"})
    attn_ms_per_token: float | None = field(default=None, metadata={"unit": "ms per token"})
    steps: list[dict[str, Any]] = field(default_factory=list)  # per decode step: token, ms
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific, stored verbatim


# figure -> its unit, in the order of the fields (steps and extra are no single figure)
FIGURE_UNITS: dict[str, str] = {f.name: f.metadata["unit"] for f in fields(Figures)
                                if "unit" in f.metadata}
# figure -> the key in ``extra`` of the process CPU time (all threads) an engine measured over
# the same span, where it measures one: with the wall time it tells the engine's share of its
# CPUs (a busy process on the board's cores lowers it; a slower kernel does not)
CPU_FIGURES: dict[str, str] = {"prefill_ms": "prefill_cpu_ms",
                               "decode_ms_per_token": "decode_cpu_ms_per_token"}


@dataclass
class TokenTiming:
    """One decode step of a `generate` run: ``steps[step]`` of the engine output."""

    step: int  # 0-based index of the generated token
    token: int  # the generated token id
    ms: float  # wall time of the whole decode step
    attn_ms: float | None = None  # time spent in attention during that step


@dataclass
class Outcome:
    """What a run produced, and how good it was. Fields that do not apply stay None."""

    generated_ids: list[int] | None = None  # `generate`: the generated token ids
    text: str | None = None  # the generated ids decoded to text
    expected_answer: str | None = None  # the needle answer the workload expects
    recall: float | None = None  # 1.0 when the answer was recalled, 0.0 when not
    nll: float | None = None  # `ppl`: mean negative log-likelihood, nats/token
    ppl: float | None = None  # `ppl`: perplexity = exp(nll)
    selection_mass: float | None = None  # attention mass captured by the selected blocks
    oracle_recall: float | None = None  # fraction of the oracle's top-k blocks selected
    max_abs_diff: float | None = None  # max |out - exact out| of the attention output
    bytes_read: int | None = None  # KV bytes read per decode step by the policy
    attn_median_ms: float | None = None  # `attn-bench`: median attention time
    extra: dict[str, Any] = field(default_factory=dict)  # any other figure, kept verbatim
    peak_rss_kb: int | None = None  # the engine process's peak resident set (weights included)
    kv_allocated_bytes: int | None = None  # KV cache reserved for the whole context (virtual)
    kv_resident_bytes: int | None = None  # KV cache touched: the most it held at once


@dataclass
class Snapshot:
    """A device fingerprint (governor, frequencies, temperature, load ...) around a run."""

    phase: str  # "before" or "after" the run
    fingerprint: dict[str, Any]
    taken_at: datetime | None = None


@dataclass
class RunResult:
    """One attempt at a run of the matrix: the run's identity (a row of ``runs``) and one
    measurement of it (a row of ``measurements`` plus its child rows).

    ``run_key`` is the deterministic key of the run (engine build, model, workload, engine
    config, device, repeat index): the store holds one ``runs`` row per key and appends a
    measurement per attempt.
    """

    run_key: str
    experiment_id: int
    device_id: int
    command: str  # engine subcommand: "generate", "ppl", "attn-bench"; "llama-bench"
    status: str = "ok"  # one of RUN_STATUSES
    engine: str = "lmc"  # the harness.engines adapter that ran it
    build_id: int | None = None
    model_id: int | None = None  # None for `attn-bench` (synthetic data)
    workload_id: int | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the full engine config of the run
    # The common engine axes, also kept as columns so that reports can group by them.
    policy: str | None = None  # exact|sparse|window|h2o|quest|random|oracle
    k: int | None = None
    block: int | None = None
    probes: int | None = None
    kv: str | None = None  # f32|q8
    wq: str | None = None  # f32|q8
    threads: int | None = None
    prefill_attn: str | None = None
    repeat: int = 0  # repeat index within the matrix
    exit_code: int | None = None  # of the engine process; None when it never ran
    error: str | None = None  # stderr / the reason of a failure or interruption
    started_at: datetime | None = None
    finished_at: datetime | None = None
    wall_ms: float | None = None  # whole run seen by the coordinator (push, exec, fetch)
    engine_ms: float | None = None  # the engine process alone
    overhead_ms: float | None = None  # wall_ms - engine_ms: the harness's cost
    prefill_ms: float | None = None
    decode_ms_per_token: float | None = None
    attn_ms_per_token: float | None = None
    prompt_tokens: int | None = None
    raw_json: str | None = None  # the engine's stdout, verbatim
    lease_id: str | None = None  # the board lease (db.leases) the run was made under
    job_id: int | None = None  # the job (db.jobs) whose coordinator made the attempt
    token_timings: list[TokenTiming] = field(default_factory=list)
    outcome: Outcome | None = None
    snapshots: list[Snapshot] = field(default_factory=list)


def timings_from_steps(steps: Iterable[Mapping[str, Any]]) -> list[TokenTiming]:
    """Token timings from the ``steps`` list of an engine `generate` output."""
    return [
        TokenTiming(step=i, token=int(s["token"]), ms=float(s["ms"]),
                    attn_ms=None if s.get("attn_ms") is None else float(s["attn_ms"]))
        for i, s in enumerate(steps)
    ]
