"""The driver's side of a run: a ``RunReport`` from a board, mapped into the store's record.

The scheduler (and nothing on a board) calls these: ``to_run_result`` for a finished run,
``base_result`` for the record of a run without measurements (pending, interrupted, cancelled).
The common figures come from the engine's adapter (``harness.engines``: ``measurements``); the
outcome fields of each lmc command (generated tokens and the needle's recall, perplexity, the
attention median, selection quality) are mapped here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from db.records import Outcome, RunResult, Snapshot, timings_from_steps
from harness import engine_output, workloads
from harness.engines import get_engine
from harness.plan import PlannedRun
from harness.runner import RunReport


def _selection_outcome(figures: dict[str, Any]) -> dict[str, Any]:
    """The engine's --measure-selection figures, under the outcome's field names."""
    names = {"mass": "selection_mass", "oracle_recall": "oracle_recall",
             "max_abs_diff": "max_abs_diff", "bytes_read": "bytes_read"}
    found = {names[k]: v for k, v in figures.items() if k in names}
    if "bytes_read" in found:
        found["bytes_read"] = int(found["bytes_read"])
    return found


def to_run_result(report: RunReport, planned: PlannedRun, device_id: int,
                  model_dir: Path | None) -> RunResult:
    """The store's record of one finished (ok or failed) run."""
    result = base_result(planned, device_id, report.status, report.error)
    result.exit_code = report.exit_code
    result.started_at, result.finished_at = report.started_at, report.finished_at
    result.wall_ms, result.engine_ms = report.wall_ms, report.engine_ms
    if report.engine_ms is not None:
        result.overhead_ms = round(report.wall_ms - report.engine_ms, 3)
    result.raw_json = report.stdout or None
    result.snapshots = [Snapshot(phase, fp, report.started_at if phase == "before"
                                 else report.finished_at)
                        for phase, fp in report.snapshots.items()]
    data = report.engine_json
    if data is None:
        return result
    figures = get_engine(planned.job.engine).measurements(planned.job.command, data)
    for name in ("prefill_ms", "decode_ms_per_token", "attn_ms_per_token", "prompt_tokens"):
        setattr(result, name, getattr(figures, name))
    result.token_timings = timings_from_steps(figures.steps)
    outcome = Outcome(extra=figures.extra)
    if planned.job.command == "generate":
        generated = [int(t) for t in data.get("tokens", [])]
        outcome.generated_ids = generated
        if model_dir is not None:
            outcome.text = workloads.answer_text(model_dir, generated)
        if planned.answer is not None and model_dir is not None:
            outcome.expected_answer = planned.answer
            outcome.recall = 1.0 if workloads.check_answer(model_dir, generated,
                                                           planned.answer) else 0.0
    elif planned.job.command == "ppl":
        outcome.nll, outcome.ppl = data.get("nll"), data.get("ppl")
        if "key_ranking" in data:  # --measure-keys
            outcome.extra["key_ranking"] = data["key_ranking"]
    elif planned.job.command == "attn-bench":
        outcome.attn_median_ms = data.get("ms")
    if planned.job.command in ("generate", "attn-bench"):
        for key, value in _selection_outcome(data.get("selection") or {}).items():
            setattr(outcome, key, value)
    if engine_output.TRACE_KEY in data:
        outcome.extra[engine_output.TRACE_KEY] = data[engine_output.TRACE_KEY]
    result.outcome = outcome
    return result


def base_result(planned: PlannedRun, device_id: int, status: str,
                error: str | None) -> RunResult:
    """A run record without measurements: the start of every record, and by itself the record
    of a run that is pending or was interrupted."""
    cell = planned.cell
    config = cell.config
    lmc_axes = config.as_dict()  # llama-bench's config has no policy, k, block ...
    return RunResult(
        run_key=planned.key,
        experiment_id=planned.experiment_id,
        device_id=device_id,
        engine=cell.engine,
        command=planned.job.command,
        status=status,
        build_id=planned.build_id,
        model_id=planned.model_id,
        workload_id=planned.workload_id,
        config=config.as_dict() | {"workload": dict(cell.workload.params),
                                   "revision": cell.revision,
                                   "placement": cell.placement.key,
                                   "argv_options": list(planned.job.options)}
        | ({"predictor_file": planned.job.predictor} if planned.job.predictor else {}),
        policy=lmc_axes.get("policy"), k=lmc_axes.get("k"), block=lmc_axes.get("block"),
        probes=lmc_axes.get("probes"), kv=config.kv, wq=config.wq, threads=config.threads,
        prefill_attn=lmc_axes.get("prefill_attn"),
        repeat=cell.repeat,
        attempts=max(planned.attempts, 1),
        error=error,
    )
