"""The driver's side of a run: a ``RunReport`` from a board, mapped into the store's record.

The scheduler (and nothing on a board) calls these: ``to_run_result`` for a finished run,
``base_result`` for the record of an attempt without figures (running, lost, pending,
interrupted, cancelled).
The common figures and the outcome come from the engine's adapter (``figures``,
``outcome``); generated tokens are decoded to text with the model's tokenizer, and the
workload's kind scores the outcome (the needle's recall). Nothing here names an engine or a
workload kind.
"""

from __future__ import annotations

from pathlib import Path

from db.records import FIGURE_UNITS, RunResult, Snapshot, timings_from_steps
from harness.contract import RunReport
from harness.engines import adapter_of
from harness.plan.planner import PlannedRun
from harness.workloads.prompts import answer_text


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
    adapter, command = adapter_of(planned.order.engine), planned.order.command
    figures = adapter.figures(command, data)
    for name in FIGURE_UNITS:
        setattr(result, name, getattr(figures, name))
    result.token_timings = timings_from_steps(figures.steps)
    outcome = adapter.outcome(command, data, figures)
    if outcome.generated_ids is not None and model_dir is not None:
        outcome.text = answer_text(model_dir, outcome.generated_ids)
    planned.cell.workload.workload_kind.score(outcome, model_dir, planned.answer)
    result.outcome = outcome
    return result


def base_result(planned: PlannedRun, device_id: int, status: str,
                error: str | None) -> RunResult:
    """A run record without the engine's figures: the start of every record, and by itself the
    record of a run that is pending or was interrupted."""
    cell, order = planned.cell, planned.order
    return RunResult(
        run_key=planned.key,
        experiment_id=planned.experiment_id,
        device_id=device_id,
        engine=cell.engine,
        command=order.command,
        status=status,
        build_id=planned.build_id,
        model_id=planned.model_id,
        workload_id=planned.workload_id,
        config=cell.config.as_dict() | {"workload": dict(cell.workload.params),
                                        "revision": cell.revision,
                                        "placement": cell.placement.key,
                                        "argv_options": list(order.options)}
        | planned.stored,
        **cell.config.columns(),
        repeat=cell.repeat,
        error=error,
    )
