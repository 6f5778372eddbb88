"""The checklists of harness/engines/README.md hold: a scratch engine and a scratch workload kind,
registered the way the checklists say (their own module and one line in the registry) and
nothing else, go through every step a run takes on the driver — the spec, the matrix, the plan
and its run keys and work orders, the dry-run estimate, and the store's record of a result.
(The attention policy's checklist is held by tests/engine/test_policy_checklist.py, which
builds a copy of the engine with a scratch policy.)"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fixtures_model import NEEDLE_MODEL

from db.records import AXIS_COLUMNS, Figures, Outcome
from devices.inventory import local_device
from harness import REPO_ROOT
from harness.contract import RunReport, WorkOrder
from harness.engines import ENGINES
from harness.engines.base import BuildRecord, PlannedWork, Prepared
from harness.execution.results import base_result, to_run_result
from harness.identity import WORKTREE
from harness.plan.estimate import estimate
from harness.plan.matrix import expand, resolve_placements
from harness.plan.planner import identities, make_plan
from harness.spec import parse_spec
from harness.workloads import kinds
from harness.workloads.base import Axis, Material, Setting, WorkloadKind, synthetic

README = REPO_ROOT / "harness" / "engines" / "README.md"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
# each checklist's heading in the README, and the architecture page's for the same change
SAME_COUNTS = {"Add an engine": "An engine",
               "Add an attention policy (lmc)": "An attention policy of lmc",
               "Add a workload kind": "A workload kind"}


@dataclass(frozen=True)
class ScratchConfig:
    threads: int

    def as_dict(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def columns(self) -> dict[str, Any]:
        return {"threads": self.threads}


class ScratchAdapter:
    """The least an engine is: every method of base.EngineAdapter, in one class."""

    name = "scratch-engine"
    section = "scratch-engine"
    source_paths = ()
    axis_columns = ("threads",)
    timing_columns = ()
    reproducible = False

    def default_revisions(self) -> list[str]:
        return [WORKTREE]

    def parse_section(self, check: Any, value: Any, spec_dir: Path, kinds: list[str]) -> int:
        check.table(value, self.section, {"threads"})
        return check.scalar(value.get("threads", 1), f"{self.section}.threads", "int")

    def runs_kind(self, kind: WorkloadKind) -> bool:
        return kind.name == "decode"

    def revisions(self, spec: Any) -> list[str]:
        return ["scratch-1"]

    def threads_key(self, axes: int) -> str | None:
        return None

    def configs(self, axes: int, kind: WorkloadKind, default_threads: int) -> list[ScratchConfig]:
        return [ScratchConfig(axes)]

    def count_configs(self, axes: int, kind: WorkloadKind, default_threads: int) -> int:
        return 1

    def _record(self, revision: str, arch: str) -> BuildRecord:
        return BuildRecord(arch, "release", "cc", "cc", "1", [], [], "src", revision, "k",
                           "/bin/true", "0" * 64, 0.0, False, engine=self.name)

    def prepare(self, spec: Any, axes: int, archs: list[str], build: Any) -> Prepared:
        return self.identities(spec, axes, archs)

    def identities(self, spec: Any, axes: int, archs: list[str]) -> Prepared:
        return Prepared({("scratch-1", arch): self._record("scratch-1", arch) for arch in archs})

    def work(self, point: Any, config: ScratchConfig, record: BuildRecord, prepared: Prepared,
             material: Material, timeout_s: float) -> PlannedWork:
        order = WorkOrder("", f"{point.label()} scratch t={config.threads}", self.name,
                          "scratch", record.binary, record.binary_sha256, None, None,
                          material.ids, ("--threads", str(config.threads)), timeout_s)
        return PlannedWork(order, key_model=None, model_sha=None)

    def build(self, target: str, revision: str | None) -> BuildRecord:
        return self._record(revision or "scratch-1", target)

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Any) -> list[str]:
        return [binary, *options]

    def parse(self, stdout: str, command: str) -> Any:
        return json.loads(stdout)

    def collect(self, transport: Any, order: WorkOrder, data: Any) -> None:
        pass

    def figures(self, command: str, data: Any) -> Figures:
        return Figures(decode_ms_per_token=data["ms"], prompt_tokens=data["tokens"])

    def outcome(self, command: str, data: Any, figures: Figures) -> Outcome:
        return Outcome(extra={"scratch": True})

    def rebuild(self, build: dict[str, Any]) -> BuildRecord:
        raise NotImplementedError

    def rerun(self, stored: Any, timeout_s: float) -> Any:
        raise NotImplementedError

    def health_argv(self, binary: str) -> list[str]:
        return [binary]

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        return True, "ok"


def stated_count(heading: str) -> int:
    """The number of files the README's checklist under ``heading`` says, and its list's."""
    text = README.read_text()
    found = re.search(rf"\*\*{re.escape(heading)}\*\* \((?:at most )?(\d+) files", text)
    assert found, heading
    return int(found.group(1))


def test_the_architecture_page_states_the_same_counts() -> None:
    """docs/architecture.md's "Where to add" gives each checklist's count as the README does."""
    readme, page = (" ".join(path.read_text().split()) for path in (README, ARCHITECTURE))
    for heading, theirs in SAME_COUNTS.items():
        counts = re.search(rf"\*\*{re.escape(heading)}\*\* (\([^)]*files[^)]*\))", readme)
        assert counts and f"**{theirs}** {counts[1]}" in page, heading


def test_a_new_engine_is_its_adapter_and_one_line_of_the_registry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert stated_count("Add an engine") == 5
    adapter = ScratchAdapter()
    monkeypatch.setitem(ENGINES, adapter.name, adapter)  # the registry's one line
    spec = parse_spec(f"""
name = "scratch"
model = "{NEEDLE_MODEL}"
engines = ["scratch-engine"]
repeats = 2
[scratch-engine]
threads = 3
[[workload]]
kind = "decode"
ctx = [16, 32]
max_new = 2
""", tmp_path / "scratch.toml")
    placements = resolve_placements(spec, [local_device()])
    cells = expand(spec, placements)
    assert len(cells) == 4 and {c.engine for c in cells} == {adapter.name}
    plan = make_plan(spec, placements, {"local": local_device()}, identities(spec, placements))
    assert len({run.key for run in plan.runs}) == 4
    assert all(run.order.engine == adapter.name and run.order.options == ("--threads", "3")
               for run in plan.runs)
    assert estimate(spec, placements, []).unknown == 4  # nothing stored like them yet
    run = plan.runs[0]
    record = base_result(run, 1, "running", None)
    assert record.engine == adapter.name and record.threads == 3
    assert all(getattr(record, column) is None for column in AXIS_COLUMNS if column != "threads")
    now = datetime.now(UTC)
    report = RunReport(run.key, "local", "ok", now, now, 5.0, exit_code=0, engine_ms=4.0,
                       stdout="{}", engine_json={"ms": 1.5, "tokens": 16})
    result = to_run_result(report, run, 1, spec.model)
    assert result.decode_ms_per_token == 1.5 and result.prompt_tokens == 16
    assert result.outcome is not None and result.outcome.extra == {"scratch": True}


class ScratchKind(WorkloadKind):
    """A kind whose data the engine makes itself, run by lmc's attn-bench command."""

    name = "scratch-kind"
    command = "attn-bench"
    axes = (Axis("ctx", "int", None), Axis("heads", "int", [2]), Axis("kv_heads", "int", [1]),
            Axis("head_dim", "int", [8]))
    settings = (Setting("runs", 1), Setting("seed", 0, low=0))
    uses_model = False

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        return synthetic(self.name, params)

    def score(self, outcome: Outcome, model_dir: Path | None, answer: str | None) -> None:
        outcome.extra["scored"] = True


def test_a_new_workload_kind_is_its_module_and_one_line_of_the_registry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert stated_count("Add a workload kind") == 4
    kind = ScratchKind()
    monkeypatch.setitem(kinds.KINDS, kind.name, kind)  # the registry's one line
    spec = parse_spec("""
name = "scratch-kind"
[engine.policy.exact]
[engine.policy.sparse]
k = 4
[[workload]]
kind = "scratch-kind"
ctx = [64, 128]
""", tmp_path / "kind.toml")
    placements = resolve_placements(spec, [local_device()])
    plan = make_plan(spec, placements, {"local": local_device()}, identities(spec, placements))
    assert len(plan.runs) == 4
    assert {r.order.command for r in plan.runs} == {"attn-bench"}
    assert all("--ctx" in r.order.options and r.order.ids is None for r in plan.runs)
    run = next(r for r in plan.runs if "sparse" in r.order.label)
    assert run.order.label.startswith("scratch-kind ctx=")
    now = datetime.now(UTC)
    report = RunReport(run.key, "local", "ok", now, now, 5.0, exit_code=0,
                       engine_json={"ms": 0.25, "runs": [0.25], "ctx": 64})
    result = to_run_result(report, run, 1, None)
    assert result.outcome is not None and result.outcome.extra.get("scored") is True
    assert result.outcome.attn_median_ms == 0.25
    assert asdict(result)["policy"] == "sparse"
