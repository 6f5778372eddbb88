"""`benchfarm run` end to end: plan a spec on Ray, run what is missing, report the counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from db.store import Store
from devices.inventory import Inventory
from harness.cluster import check_resources, ray_session
from harness.matrix import MAX_RUNS, check_size, resolve_placements
from harness.plan import make_plan
from harness.progress import Progress
from harness.scheduler import Scheduler, build_on_ray
from harness.spec import Spec


@dataclass
class RunSummary:
    experiment: str
    total: int  # runs in the matrix
    skipped: int  # already stored as ok
    counts: Counter[str] = field(default_factory=Counter)  # this session: ok/failed/pending...

    @property
    def complete(self) -> bool:
        return not (self.counts["pending"] or self.counts["interrupted"])

    def line(self) -> str:
        c = self.counts
        return (f"experiment {self.experiment}: {self.total} runs in the matrix, "
                f"{self.skipped} already done, {c['ok']} ok, {c['failed']} failed, "
                f"{c['pending']} pending now")


def run_experiment(spec: Spec, inventory: Inventory, store: Store,
                   selectors: Sequence[str] | None = None, force: bool = False,
                   ray_address: str | None = None, stream: TextIO | None = None,
                   max_runs: int = MAX_RUNS) -> RunSummary:
    resources: dict[str, float] = {}
    for device in inventory.devices.values():
        for name, amount in device.resources.items():
            # a runner holds its board's resources while it lives: a local instance, where
            # every board runs, declares enough for all of them at once
            resources[name] = resources.get(name, 0.0) + amount
    placements = resolve_placements(spec, list(inventory.devices.values()), selectors)
    check_size(spec, placements, max_runs)  # before Ray starts and before anything is stored
    with ray_session(ray_address, resources):
        check_resources([inventory.devices[name] for p in placements for name in p.devices])
        plan = make_plan(spec, inventory, store, build_on_ray, selectors, force)
        summary = RunSummary(spec.name, len(plan.runs), plan.skipped)
        progress = Progress(len(plan.todo), list(plan.boards), plan.skipped, stream)
        progress.show()
        try:
            if plan.todo:
                summary.counts = Scheduler(plan, store, progress).run()
        finally:
            progress.close()
    return summary
