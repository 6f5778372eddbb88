"""Whether exact attention, the baseline every other config is measured against, does its own
workload: a needle it never finds (recall 0) or a perplexity no trained model gives says that the
engine, the model or the workload is wrong (a ``max_new`` too short to state the answer, a model
read wrongly), and every comparison against it is meaningless. A report and ``benchfarm status``
open with the warning this module words.

Plain Python (no pandas): ``status`` reads its cells from the store's summary
(``cells_of_groups``), a report from its flattened runs (``cells_of_runs``). `status`'s list of
experiments reads the failures each experiment keeps (``experiments.baseline``): found once its
runs land (``keep_baseline_of``, at a job's end) or, when runs landed since, by the list itself
from the experiment's exact runs only (``listed_failures``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from db.queries import ExperimentLine, GroupSummary
    from db.store import Store

EXACT = "exact"
# A perplexity above this is a failure, not a result: a model guessing uniformly among 1000
# tokens scores it, and the shipped models score about 90 (pydoc-lm on its held-out text).
ABSURD_PPL = 1000.0


@dataclass(frozen=True)
class BaselineCell:
    """Exact attention's quality on one device and workload (recall a mean, ppl a median)."""

    device: str
    workload: str  # what was run, as people read it: "needle ctx=256", "generate"
    recall: float | None
    ppl: float | None


def _present(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def failures(cells: Iterable[BaselineCell]) -> list[str]:
    """One phrase per cell where exact attention fails its workload, in the cells' order."""
    found = []
    for cell in cells:
        if _present(cell.recall) and cell.recall <= 0.0:
            found.append(f"{cell.device} {cell.workload}: recall {cell.recall:.2f}")
        if _present(cell.ppl) and (not math.isfinite(cell.ppl) or cell.ppl > ABSURD_PPL):
            found.append(f"{cell.device} {cell.workload}: perplexity {cell.ppl:.4g}")
    return found


def baseline_warning(cells: Iterable[BaselineCell]) -> str:
    """The warning a report or status opens with; "" when exact attention does its work."""
    found = failures(cells)
    if not found:
        return ""
    return ("WARNING: exact attention, the baseline, fails its own workload ("
            + "; ".join(found) + "). Check the workload (a needle's max_new must hold the "
            "answer's sentence), the model and the engine before reading any comparison "
            "against it.")


def cells_of_runs(runs: Any) -> list[BaselineCell]:
    """Exact attention's cells of a report's flattened runs (``reports.runs``): per device,
    workload kind and context (or text) length, over its ok runs."""
    ok = runs[(runs["status"] == "ok") & (runs["policy"] == EXACT)]
    cells = []
    keys = ["device", "kind", "ctx", "length"]
    for key, cell in ok.groupby(keys, dropna=False, sort=True):
        device, kind, ctx, length = key
        name, size = ("length", length) if _present(length) else ("ctx", ctx)
        workload = str(kind) + (f" {name}={int(size)}" if _present(size) else "")
        recall = cell["recall"].dropna()
        ppl = cell["ppl"].dropna()
        cells.append(BaselineCell(str(device), workload,
                                  float(recall.mean()) if len(recall) else None,
                                  float(ppl.median()) if len(ppl) else None))
    return cells


def cells_of_groups(groups: Iterable[GroupSummary]) -> list[BaselineCell]:
    """Exact attention's cells of `status EXPERIMENT`'s groups (db.queries.GroupSummary)."""
    return [BaselineCell(g.device, g.command, g.recall, g.ppl) for g in groups
            if g.policy == EXACT]


def keep_baseline_of(store: Store, experiment: str, reading: bool = False) -> str:
    """Find the experiment's baseline failures from its exact runs and keep them in the store
    (as found at its writes then; for a read command, ``reading``, only when that needs no
    wait); returns them joined by "; " ("" for none)."""
    writes, groups = store.policy_groups(experiment, EXACT)
    found = "; ".join(failures(cells_of_groups(groups)))
    if reading:
        store.keep_baseline_unless_busy(experiment, writes, found)
    else:
        store.keep_baseline(experiment, writes, found)
    return found


def listed_failures(store: Store, lines: Iterable[ExperimentLine]) -> dict[str, str]:
    """Per listed experiment, its baseline failures ("" for none): as kept, else found now
    and kept when the store takes the write at once (an experiment whose runs landed since
    they were found)."""
    return {line.name: line.baseline if line.baseline is not None
            else keep_baseline_of(store, line.name, reading=True) for line in lines}
