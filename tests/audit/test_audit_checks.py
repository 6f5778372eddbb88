"""The audit's checks that need no store: the attention-reference article's claims (lmc run
directly against numpy, and float32 arithmetic), the selection-trace and repetition rules, and
lmc --exact-first-layer (the one layer-0 treatment the eviction-prediction article's claims
compare policies under)."""

from __future__ import annotations

from pathlib import Path

from fixtures_engine import lmc_json, write_tokens

from harness.verify.engine_checks import EngineChecks
from reports.audit import NOT_REPRODUCED, REPRODUCED, Environment, load_claims, run_audit
from reports.audit.checks_identity import collapsed, repeats, shared_blocks

REPO = Path(__file__).resolve().parents[2]


def test_attention_reference_claims_against_an_independent_reference(needle_model: Path) -> None:
    claims = load_claims(REPO / "claims" / "seed_002_attention_reference.toml")
    verdicts = {v.claim.id: v for v in run_audit(claims, None, Environment(("needle-tiny",)),
                                                 None, EngineChecks(needle_model).checks())}
    assert {v.kind for v in verdicts.values()} == {"verified", "sanity"}
    # lmc's kernel against its plain reference, both float32: the article's 1e-7 ruler holds
    assert verdicts["002-kernel-matches-plain-reference"].verdict == REPRODUCED
    # against float64 numpy both are within float32 rounding (about 1e-7 at 4096 positions);
    # the plain reference, whose sums are pairwise, well within the ruler
    for name in ("002-kernel-matches-reference", "002-plain-reference-matches"):
        assert 0 < verdicts[name].measured < 1e-6 and verdicts[name].verdict == REPRODUCED
    # lmc applies the 1/sqrt(d) scale: far from the formula without it
    assert verdicts["002-scale-is-part-of-the-formula"].measured > 0.1
    causal = verdicts["002-causal"]
    assert causal.verdict == REPRODUCED and causal.measured == 0.0
    assert "needle-tiny" in causal.evidence.model and "lmc " in causal.evidence.revision
    # length alone does not overflow unscaled float32 scores of unit variance; large values do,
    # and max-subtraction or the scale keeps them finite
    assert verdicts["002-no-scale-long-context-nan"].verdict == NOT_REPRODUCED
    for name in ("002-no-scale-large-values-nan", "002-max-subtraction-keeps-finite",
                 "002-scale-keeps-finite", "002-fp32-exp-89-is-inf", "002-dot-grows-as-sqrt-d"):
        assert verdicts[name].verdict == REPRODUCED, verdicts[name].reason


def test_without_the_engine_the_engine_checks_are_not_comparable() -> None:
    claims = load_claims(REPO / "claims" / "seed_002_attention_reference.toml")
    verdict = next(v for v in run_audit(claims, None, Environment(("needle-tiny",)))
                   if v.claim.id == "002-causal")
    assert verdict.verdict == "not comparable" and "runs the engine itself" in verdict.reason


def test_trace_and_repetition_rules() -> None:
    trace = "# header\n9 0 0 2 3 5\n9 0 1 2 3 6\n10 0 0 2 3 7\n9 1 0 1 4\n10 1 0 1 4\n"
    assert shared_blocks(trace) == (1, 2)  # layer 0 shares block 3, layer 1 block 4
    # block 1 holds positions 32-63: every selection keeps it, but as the tail (recency)
    assert shared_blocks("# header\n40 0 0 2 1 3\n41 0 1 2 1 3\n") == (1, 2)
    assert repeats([7, 5, 5, 5]) and repeats([1, 2, 9, 8, 9, 8, 9, 8])
    assert not repeats([1, 2, 3, 1, 2, 4, 1, 2]) and not repeats([])
    # a collapse without repetition: k = 1's `The606.` keeps 5 of exact's 14 tokens
    exact = [266, 1098, 944, 1063, 794, 1007, 600, 18, 21, 12, 19, 12, 11, 2]
    assert collapsed([266, 18, 12, 18, 11, 2], exact) and not repeats([266, 18, 12, 18, 11, 2])
    assert not collapsed(exact, exact) and not collapsed([266, 1098, 944, 1063, 794], None)


def test_exact_first_layer_gives_every_policy_the_same_layer_0(lmc: Path, needle_model: Path,
                                                               tmp_path: Path) -> None:
    ids = write_tokens(tmp_path / "ids.txt", [(i * 37) % 1100 + 5 for i in range(300)])
    trace = tmp_path / "trace.txt"
    doc = lmc_json(lmc, "generate", "--model", needle_model, "--prompt", ids, "--max-new", "3",
                   "--attn", "h2o-prev", "--k", "2", "--exact-first-layer",
                   "--trace-selection", trace)
    assert doc["config"]["exact_first_layer"] is True
    blocks = {int(f[1]): int(f[3]) for f in (line.split() for line in
                                             trace.read_text().splitlines()[1:])}
    assert blocks == {0: 10, 1: 2}  # layer 0 every block of 300+ positions, layer 1 k = 2
    ranked = lmc_json(lmc, "ppl", "--model", needle_model, "--text", ids, "--attn", "window",
                      "--measure-keys", "8", "--exact-first-layer")["key_ranking"]
    assert [layer["queries"] for layer in ranked["layers"]][0] == 0  # layer 0 is not ranked
    assert ranked["layers"][1]["queries"] > 0
    plain = lmc_json(lmc, "ppl", "--model", needle_model, "--text", ids, "--attn", "window",
                     "--measure-keys", "8")["key_ranking"]
    assert plain["layers"][0]["queries"] > 0


def test_probe_cost_compares_bytes_per_kv_head() -> None:
    """lmc counts exact attention's KV bytes per query head and the probes' per KV head (a GQA
    group probes once): the claim's ratio takes both per KV head, and a column already given
    (the probes' select_bytes renamed to it) is kept as it is."""
    import pandas as pd

    from reports.audit.checks_timing import PER_KV_HEAD, with_field

    exact = pd.DataFrame({"kv_bytes": [64.0e6], "heads": [16], "kv_heads": [8],
                          "raw_json": ["{}"]})
    assert with_field(exact, PER_KV_HEAD)[PER_KV_HEAD].tolist() == [32.0e6]
    probes = exact.assign(**{PER_KV_HEAD: [4.0e6]})
    assert with_field(probes, PER_KV_HEAD)[PER_KV_HEAD].tolist() == [4.0e6]
