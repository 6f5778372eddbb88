"""A spec measured at one engine revision on one placement, through the coordinator
(``harness.execution.coordinator.run_experiment``), reusing what the store holds.

Before anything runs, the revision's runs are named by their run keys from the build's
identity (nothing built, as `run --dry-run` does); when all are stored as ok, nothing is built
or run. Otherwise the revision is built first, so that one that does not build is reported as
such (and can be skipped) instead of failing the whole matrix. The revisions are commits of
the folders the spec's engines are built from (``paths``); every engine is built and named
through its adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

from db.store import Store
from devices.inventory import Inventory
from harness.access.caller import Caller
from harness.engines import adapter_of, source_paths
from harness.errors import InputError, RunFailure
from harness.execution.cluster import ray_session
from harness.execution.coordinator import RunRequest, inventory_resources, run_experiment
from harness.identity import DIRTY, WORKTREE, git_output
from harness.plan.matrix import Placement, engines_of, resolve_placements
from harness.plan.planner import identities, make_plan
from harness.spec import Spec
from reports.history import RevisionRun, revision_runs


class BuildFailed(RunFailure):
    """The revision's engine does not build."""


def history_paths(spec: Spec) -> list[str]:
    """The folders of this repository the spec's engines are built from (its revisions are
    their commits); InputError when no engine of the spec is built from here."""
    paths = source_paths(engines_of(spec))
    if not paths:
        raise InputError(f"{spec.path}: no engine of the spec is built from this repository, "
                         "so its revisions have no history here")
    return paths


@dataclass
class Measurer:
    """Measures ``spec`` on one device (or class) at the revisions asked for. Ray starts at
    the first run and stops when the measurer is closed (``with Measurer(...) as m``)."""

    spec: Spec
    inventory: Inventory
    store: Store
    selector: str  # a device or class name
    ray_address: str | None = None
    stream: TextIO | None = None
    caller: Caller | None = None  # whose jobs its runs are (None: resolved from the store)
    placement: Placement = field(init=False)
    _ray: contextlib.ExitStack = field(init=False, default_factory=contextlib.ExitStack)
    _ray_up: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.placement = resolve_placements(self.spec, list(self.inventory.devices.values()),
                                            [self.selector])[0]

    @property
    def paths(self) -> list[str]:
        return history_paths(self.spec)

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._ray.close()

    def source_hash(self, revision: str) -> str:
        return self._plan([revision]).builds[(revision, self.placement.build_target)].source_hash

    def check_sources(self, revision: str) -> None:
        """BuildFailed when ``revision`` has none of a folder the spec's engines are built
        from (a commit that deleted ``engine/``): it is skipped as one that does not build."""
        if revision == WORKTREE or revision.endswith(DIRTY):
            return  # the working tree: its sources are where they are
        for path in self.paths:
            if not git_output("ls-tree", "--name-only", f"{revision}^{{commit}}", "--", path):
                raise BuildFailed(f"revision {revision} does not build: it has no {path}/")

    def missing(self, revisions: Sequence[str]) -> list[str]:
        """The revisions of which some run is not stored as ok (nothing is built); BuildFailed
        for one without the engines' sources."""
        for revision in revisions:
            self.check_sources(revision)
        plan = self._plan(revisions)
        done = self.store.completed_run_keys([r.key for r in plan.runs])
        return list(dict.fromkeys(r.cell.revision for r in plan.runs if r.key not in done))

    def build(self, revision: str) -> None:
        """Build the revision of every engine of the spec built from this repository, for the
        placement's architecture (the coordinator's build then finds it built); BuildFailed
        when one does not build (or has no sources: ``check_sources``)."""
        self.check_sources(revision)
        try:
            for name in engines_of(self.spec):
                if adapter_of(name).source_paths:
                    adapter_of(name).build(self.placement.build_target, revision)
        except RunFailure as exc:
            first = str(exc).splitlines()[0].rstrip(":")
            raise BuildFailed(f"revision {revision} does not build: {first}") from exc

    def run(self, revisions: Sequence[str], repeats: int | None = None) -> None:
        """Run the spec at ``revisions`` (built before, see ``build``), with ``repeats``
        instead of the spec's (more: the runs of the repeats beyond those stored, one round);
        what is stored is skipped by the coordinator itself."""
        if not revisions:
            return
        if not self._ray_up:
            self._ray.enter_context(ray_session(self.ray_address,
                                                inventory_resources(self.inventory)))
            self._ray_up = True
        spec = replace(self.spec, revisions=list(revisions),
                       repeats=repeats or self.spec.repeats)
        run_experiment(RunRequest(spec,
                                  self.inventory, [self.selector],
                                  ray_address=self.ray_address, stream=self.stream,
                                  caller=self.caller),
                       self.store)

    def results(self, revision: str) -> dict[str, list[RevisionRun]]:
        """config -> every ok run of the experiment with the revision's engine sources on the
        placement's boards (by source hash: a revision with the sources of another reuses its
        runs), each once (the store lists a run under every revision that builds it)."""
        wanted = self.source_hash(revision)
        found = {r.run_id: r for r in self.stored() if r.source_hash == wanted
                 and r.device in self.placement.devices}
        return _by_config(list(found.values()))

    def stored(self) -> list[RevisionRun]:
        if self.spec.name not in self.store.list_experiments():
            return []
        return revision_runs(self.store, self.spec.name)

    def _plan(self, revisions: Sequence[str]):
        spec = replace(self.spec, revisions=list(revisions))
        return make_plan(spec, [self.placement], self.inventory.devices,
                         identities(spec, [self.placement]))


def _by_config(runs: list[RevisionRun]) -> dict[str, list[RevisionRun]]:
    out: dict[str, list[RevisionRun]] = {}
    for run in runs:
        out.setdefault(run.config, []).append(run)
    return out
