"""Checks proven able to fail: every claim of the shipped claims files that names an engine
mutant is judged against lmc built with that rule broken (harness.verify.engine_checks.MUTANTS),
and its verdict must flip; a rule claim without one is never graded "verified"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness import ENGINE_DIR
from harness.verify.engine_checks import MUTANTS, EngineChecks, build_mutant, mutant_sources
from reports.audit import NOT_REPRODUCED, REPRODUCED, Environment, load_claims, run_audit
from reports.audit.claims_file import ClaimsFile
from reports.audit.grade import UNPROVEN

REPO = Path(__file__).resolve().parents[2]
CLAIMS = sorted((REPO / "claims").glob("seed_*.toml"))
WITH_MUTANT = [(path, claim) for path in CLAIMS for claim in load_claims(path).claims
               if claim.mutant]


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


@pytest.mark.parametrize("path, claim", WITH_MUTANT, ids=[c.id for _, c in WITH_MUTANT])
def test_the_claims_verdict_flips_on_its_mutant(path: Path, claim,
                                                 release_checks: EngineChecks,
                                                 mutant_checks: dict[str, EngineChecks]) -> None:
    released = judge(path, claim, release_checks)
    assert released.verdict == REPRODUCED, released.reason
    assert released.grade in ("verified", "reproduced")
    broken = judge(path, claim, mutant_checks[claim.mutant])
    assert broken.verdict == NOT_REPRODUCED, broken.reason
    assert broken.grade in ("refuted", "not reproduced")


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
        patched = mutant_sources(name, tmp_path / name) / mutant.file
        release = (ENGINE_DIR / mutant.file).read_text()
        assert patched.read_text() != release
        for old, new in mutant.edits:
            assert old in release and new not in release


def test_every_rule_claim_of_the_shipped_files_names_a_mutant() -> None:
    """The selection rules and the renormalisation are all proven able to fail (a rule claim
    without a mutant would be graded "holds, check unproven": see the test above)."""
    unproven = [claim.id for path in CLAIMS for claim in load_claims(path).claims
                if claim.metric in ("selection_rule", "renormalised_error") and not claim.mutant]
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
