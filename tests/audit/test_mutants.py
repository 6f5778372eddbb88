"""Checks proven able to fail: every claim of the shipped claims files that names an engine
mutant is judged against lmc built with that rule broken (harness.verify.engine_checks.MUTANTS),
and its verdict must flip; a rule claim without one is never graded "verified".

A claim judged on the selection traces of an experiment's runs (``audit-000-threads``) is judged
on that experiment run by the farm into a store here (release lmc), and against a mutant on the
same stored runs with each run's trace replaced by the mutant's: its binary run here on the run's
stored prompt ids and engine flags (as `benchfarm reproduce` reruns a run)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from db.store import Store
from devices.inventory import load_inventory
from harness import ENGINE_DIR
from harness.engines.lmc import run_here
from harness.engines.lmc.output import TRACE_FLAG, TRACE_KEY
from harness.execution.coordinator import RunRequest, run_experiment
from harness.verify.claims import compose_spec
from harness.verify.engine_checks import MUTANTS, EngineChecks, build_mutant, mutant_sources
from reports.audit import NOT_REPRODUCED, REPRODUCED, Environment, load_claims, run_audit
from reports.audit.claims_file import ClaimsFile
from reports.audit.grade import UNPROVEN
from reports.audit.verdict import judge as judge_runs
from reports.audit.verdict import stored_runs

REPO = Path(__file__).resolve().parents[2]
CLAIMS = sorted((REPO / "claims").glob("seed_*.toml"))
WITH_MUTANT = [(path, claim) for path in CLAIMS for claim in load_claims(path).claims
               if claim.mutant]
COMPUTED = [(path, claim) for path, claim in WITH_MUTANT if not claim.experiments]
TRACED = [(path, claim) for path, claim in WITH_MUTANT if claim.experiments]


@pytest.fixture(scope="session")
def mutant_checks(needle_model: Path) -> dict[str, EngineChecks]:
    """The engine checks on each mutant's lmc (built once, then cached by source hash)."""
    return {name: EngineChecks(needle_model, build_mutant(name), f"mutant {name}")
            for name in MUTANTS}


@pytest.fixture(scope="session")
def release_checks(needle_model: Path) -> EngineChecks:
    return EngineChecks(needle_model)


def judge(path: Path, claim, checks: EngineChecks):
    (verdict,) = run_audit(ClaimsFile(path, [claim], {}), None,
                           Environment(("needle-tiny",)), None, checks.checks())
    return verdict


def test_every_mutant_is_named_by_a_claim() -> None:
    named = {claim.mutant for _, claim in WITH_MUTANT}
    assert named == set(MUTANTS)


@pytest.mark.parametrize("path, claim", COMPUTED, ids=[c.id for _, c in COMPUTED])
def test_the_claims_verdict_flips_on_its_mutant(path: Path, claim,
                                                 release_checks: EngineChecks,
                                                 mutant_checks: dict[str, EngineChecks]) -> None:
    released = judge(path, claim, release_checks)
    assert released.verdict == REPRODUCED, released.reason
    assert released.grade in ("verified", "reproduced")
    broken = judge(path, claim, mutant_checks[claim.mutant])
    assert broken.verdict == NOT_REPRODUCED, broken.reason
    assert broken.grade in ("refuted", "not reproduced")


@dataclass
class TracedRuns:
    """An experiment's runs as the farm stored them, with what each ran on (to run it again)."""

    experiment: str
    runs: pd.DataFrame
    inputs: dict[int, tuple[list[int], list[str]]]  # run id -> prompt ids, lmc's flags


@pytest.fixture(scope="session")
def traced_runs(ray_address: str, needle_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, TracedRuns]:
    """The experiments of the traced claims, run by the farm on this machine (release lmc)."""
    tmp = tmp_path_factory.mktemp("traced")
    inventory = tmp / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp}/work"\n')
    done = {}
    with Store.open(f"sqlite:///{tmp}/traced.db") as store:
        for path, claim in TRACED:
            claims = load_claims(path)
            for name in claim.experiments:
                if name in done:
                    continue
                spec = compose_spec(name, claims.experiments[name], needle_model, ["local"],
                                    path)
                run_experiment(RunRequest(spec, load_inventory(inventory), ["local"],
                                          ray_address=ray_address), store)
                runs = stored_runs(store, name)
                details = [store.get_run(int(i)) for i in runs["run_id"]]
                done[name] = TracedRuns(name, runs, {
                    int(d.run["id"]): ([int(i) for i in d.workload["ids"]],
                                       list(d.run["config"]["argv_options"]))
                    for d in details})
    return done


def retraced(traced: TracedRuns, binary: Path, model: Path) -> pd.DataFrame:
    """The stored runs with each one's selection trace from ``binary`` run here on the run's
    own prompt ids and engine flags."""
    extras = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.txt"
        for run_id, extra in zip(traced.runs["run_id"], traced.runs["extra"], strict=True):
            ids, flags = traced.inputs[int(run_id)]
            flags = [str(trace) if i and flags[i - 1] == TRACE_FLAG else f
                     for i, f in enumerate(flags)]
            run_here(binary, "generate", model, ids, flags)
            extras.append(json.dumps({**json.loads(extra), TRACE_KEY: trace.read_text()}))
    return traced.runs.assign(extra=extras)


def test_rerunning_a_stored_run_here_gives_its_stored_trace(
        lmc: Path, needle_model: Path, traced_runs: dict[str, TracedRuns]) -> None:
    """What makes a retraced run the stored run with another engine: the release lmc run here
    on its stored ids and flags writes the trace the farm stored."""
    for traced in traced_runs.values():
        again = retraced(traced, lmc, needle_model)
        traces = [[json.loads(e)[TRACE_KEY] for e in frame["extra"]]
                  for frame in (traced.runs, again)]
        assert traces[0] == traces[1] and all(traces[0])


@pytest.mark.parametrize("path, claim", TRACED, ids=[c.id for _, c in TRACED])
def test_a_traced_claims_verdict_flips_on_its_mutant(path: Path, claim, needle_model: Path,
                                                     traced_runs: dict[str, TracedRuns]) -> None:
    (name,) = claim.experiments
    released = judge_runs(claim, traced_runs[name].runs, name)
    assert released.verdict == REPRODUCED, released.reason
    assert released.grade == "verified"
    binary = build_mutant(claim.mutant)
    broken = judge_runs(claim, retraced(traced_runs[name], binary, needle_model), name)
    assert broken.verdict == NOT_REPRODUCED, broken.reason
    assert broken.grade == "refuted"


def test_a_rule_claim_without_a_mutant_is_not_verified(release_checks: EngineChecks) -> None:
    path = REPO / "claims" / "seed_000_sparse_topk.toml"
    claim = next(c for c in load_claims(path).claims if c.id == "000-ties-lower-index")
    unproven = dataclasses.replace(claim, mutant="")
    assert judge(path, claim, release_checks).grade == "verified"
    assert judge(path, unproven, release_checks).grade == UNPROVEN


def test_causal_prefix_on_a_tile_boundary_misses_the_causal_mutant(
        mutant_checks: dict[str, EngineChecks]) -> None:
    """Why 002-causal's prefix is 250: at 256 the prefix's last query ends a prefill tile, so
    a kernel that lets each query see one row of the future still passes."""
    path = REPO / "claims" / "seed_002_attention_reference.toml"
    claim = next(c for c in load_claims(path).claims if c.id == "002-causal")
    on_boundary = dataclasses.replace(claim, measure=dataclasses.replace(
        claim.measure, params={**claim.measure.params, "prefix": 256, "seeds": [0]}))
    assert judge(path, on_boundary, mutant_checks["causal"]).verdict == REPRODUCED


def test_mutants_leave_the_release_sources_alone(tmp_path: Path) -> None:
    for name, mutant in MUTANTS.items():
        patched = mutant_sources(name, tmp_path / name)
        for file, edits in mutant.edits.items():
            release = (ENGINE_DIR / file).read_text()
            assert (patched / file).read_text() != release
            for old, new in edits:
                assert old in release and new not in release


def test_every_rule_claim_of_the_shipped_files_names_a_mutant() -> None:
    """The selection rules, the renormalisation, the rules read off selection traces, the
    prefill importance's mode and the kernels' and plain reference's agreement with the formula
    are all proven able to fail (a rule claim without a mutant would be graded "holds, check
    unproven": see the test above)."""
    unproven = [claim.id for path in CLAIMS for claim in load_claims(path).claims
                if claim.metric in ("selection_rule", "renormalised_error", "identical_traces",
                                    "trace_shared_blocks", "reference_error",
                                    "prefill_importance")
                and not claim.mutant]
    assert unproven == []


def test_renormalised_output_is_told_from_whole_context_softmax(
        release_checks: EngineChecks) -> None:
    """The renormalisation check can tell the alternative apart: lmc's sparse output is far from
    attention over every position, though within float32 rounding of the selected ones."""
    path = REPO / "claims" / "seed_000_sparse_topk.toml"
    claim = next(c for c in load_claims(path).claims if c.id == "000-softmax-over-selected-only")
    reading = release_checks.renormalised_error(claim, None)
    whole = float(reading.detail.rsplit("up to ", 1)[1])
    assert reading.value < 1e-6 < 1e-3 < whole
