"""Claims files (``claims/*.toml``): parse and validate published claims.

A file holds ``[[claim]]`` tables and the experiments that test them::

    [experiment.audit-000-needle]          # a spec fragment: engine, workload, repeats ...
    repeats = 1
    [experiment.audit-000-needle.engine.policy.sparse]
    k = [1, 32]
    [[experiment.audit-000-needle.workload]]
    kind = "needle"
    ctx = 2061

    [[claim]]
    id = "000-k32-identical"
    source = "seeds/000 section 3"
    statement = "k = 32 gives output byte-identical to exact attention"
    quote = "k=32 与精确在输出上逐字节一致"  # the source's own words, verbatim (optional)
    kind = "analogue"                      # direct (default; relation with bounds), analogue,
                                           # relation, verified or sanity (KINDS)
    strength = "figure"                    # what a pass shows (reports.audit.grade; default
                                           # from kind and metric)
    article = "k=32 output identical"      # the article's own figure, as it gives it
    gloss = "k=32 and exact agree byte for byte"   # the quote in English
    mutant = "budget"                      # rule claims: the engine mutant that must flip it
    differs = "needle-tiny on x86, three prompts"  # analogue: what differs from the article
    setting = "RK3588, Qwen3-VL-2B"        # the article's setting (default: the file's setting)
    metric = "identical_tokens"            # see reports.audit.checks.CHECKS
    expected = 1.0
    tolerance = 0.0                        # absolute; or rel_tolerance (fraction of expected);
                                           # one-sided claims: at_least / at_most instead
    experiment = "audit-000-needle"        # defined above, or any experiment already stored;
                                           # a list: their runs together are the evidence
    [claim.measure]                        # which runs the metric compares
    a = { policy = "exact" }
    b = { policy = "sparse", k = 32 }
    [claim.fair]                           # what must hold for the comparison to be fair
    model = "any"                          # or the model(s) the claim was measured on
    device_class = "any"
    context = 2061

Computed metrics (``reports.audit.checks.COMPUTED_METRICS``) take no experiment:
``measure.params`` sets them.

Published llama-bench rows may be given as ``[[llama_bench]]`` tables instead of (or beside)
``[[claim]]``: each becomes a claim of metric ``llama_bench_tps`` with an experiment of its own
(``reports.audit.llamabench_rows``).

Every error names the file, the claim and the key. The experiment fragments are validated as
specs by the harness before anything runs (reports does not import the harness).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.checker import Checker
from devices.files import UnreadableToml, loads_toml, read_toml_text
from reports.audit.checks import CHECKS, COMPUTED_METRICS, LLAMA_BENCH_TPS
from reports.audit.claim import ANY, Claim, Fairness, Measure, Precondition
from reports.audit.claims_check import params, selector
from reports.audit.grade import STRENGTHS
from reports.audit.llamabench_rows import LlamaBenchRow, parse_rows
from reports.errors import ReportInputError
from reports.runs import CANDIDATE_METRICS, RANK_METRICS

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# the metrics a [[claim]] may name: every one with a check but a [[llama_bench]] row's own
METRICS = tuple(name for name in CHECKS if name != LLAMA_BENCH_TPS)
TWO_CONFIG_METRICS = ("identical_tokens", "identical_traces", "time_ratio", "ppl_change")
TIME_FIELDS = ("decode_ms_per_token", "attn_ms_per_token", "prefill_ms", "attn_median_ms",
               "select_bytes", "kv_bytes", "bytes_read",  # bytes: lmc's "selection" figures
               "kv_bytes_per_kv_head")  # kv_bytes in select_bytes' units (checks_timing)
# key_rank: lmc --measure-keys, a policy's key ranking and its two-stage candidates
RANK_FIELDS = RANK_METRICS + CANDIDATE_METRICS
CLAIM_KEYS = {"id", "source", "statement", "metric", "expected", "tolerance", "rel_tolerance",
              "at_least", "at_most", "kind", "setting", "differs",
              "unit", "experiment", "measure", "fair", "quantity", "note", "quote",
              "strength", "article", "gloss", "mutant", "precondition"}
PRECONDITION_KEYS = {"what", "metric", "measure", "at_least", "at_most", "why"}
# the engine mutants tests/audit/test_mutants.py builds (harness.verify.engine_checks.MUTANTS)
MUTANTS = ("budget", "budget-short", "thread-dependent", "recency", "importance-evicted",
           "short-count", "renorm-extra", "ties", "causal", "scale", "ref-sum-short",
           "importance-exact")
# What a verdict rests on (README, "Verdict kinds"): the same quantity in a comparable setting;
# the same quantity elsewhere (``differs`` says what differs); the article's direction or order
# tested with a margin; a rule checked in code or traces; a sanity check (not counted).
KINDS = ("direct", "analogue", "relation", "verified", "sanity")
MEASURE_KEYS = {"a", "b", "baseline", "field", "field_b", "baseline_min_recall", "params"}
FAIR_KEYS = {"model", "device_class", "context", "context_tolerance", "allow_emulated"}


@dataclass(frozen=True)
class ClaimsFile:
    path: Path
    claims: list[Claim]
    experiments: dict[str, dict[str, Any]]  # name -> spec fragment (validated by the harness)


def load_claims(path: str | Path) -> ClaimsFile:
    path = Path(path)
    try:
        text = read_toml_text(path, "claims file")
    except UnreadableToml as exc:
        raise ReportInputError(str(exc)) from None
    return parse_claims(text, path)


def parse_claims(text: str, path: Path) -> ClaimsFile:
    check = Checker(path, ReportInputError, "claims file")
    top = check.at("file")
    try:
        data = loads_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise ReportInputError(f"{path}: not valid TOML: {exc}") from exc
    top.table(data, "", {"source", "setting", "claim", "experiment", "llama_bench"})
    default_source = data.get("source")
    default_setting = str(data.get("setting", ""))
    experiments = data.get("experiment", {})
    if not isinstance(experiments, dict):
        raise top.fail("experiment", "must be tables [experiment.NAME]")
    for name, fragment in experiments.items():
        if not NAME_RE.match(name):
            raise top.fail(f"experiment.{name}", "experiment names are [a-z0-9][a-z0-9._-]*")
        if not isinstance(fragment, dict):
            raise top.fail(f"experiment.{name}", "must be a table (a spec fragment)")
    raw_claims = data.get("claim", [])
    rows = parse_rows(check, data.get("llama_bench", []), default_source, NAME_RE)
    if not isinstance(raw_claims, list) or not (raw_claims or rows):
        raise top.fail("claim", "at least one [[claim]] (or [[llama_bench]]) table is required")
    claims: list[Claim] = []
    ids: set[str] = set()  # a set, not a scan of the claims: linear in the file's size
    for index, raw in enumerate(raw_claims):
        claim = _claim(check, raw, index, default_source, experiments, default_setting)
        if claim.id in ids:
            raise check.at(f"claim '{claim.id}'").fail("id", "is used by two claims")
        ids.add(claim.id)
        claims.append(claim)
    for row in rows:
        if row.id in ids:
            raise check.at(f"llama_bench '{row.id}'").fail("id", "is used by a claim too")
        if row.experiment in experiments:
            raise top.fail(f"experiment.{row.experiment}",
                           f"the name is taken by llama_bench row '{row.id}'")
        claims.append(_row_claim(row))
        if row.unrunnable() is None:
            experiments[row.experiment] = row.fragment()
    return ClaimsFile(path=path, claims=claims, experiments=experiments)


def _row_claim(row: LlamaBenchRow) -> Claim:
    """A published llama-bench row as a claim: its t/s, run the same way on the same board
    class with the same model (emulated devices never count: their timings are the
    emulator's)."""
    reason = row.unrunnable()
    return Claim(
        id=row.id, source=row.source, statement=row.statement,
        metric="reported" if reason else LLAMA_BENCH_TPS, expected=row.tps,
        tolerance=None if row.rel_tolerance is not None else 2 * row.sd,
        rel_tolerance=row.rel_tolerance, at_least=None, at_most=None, unit="t/s",
        experiment=None if reason else row.experiment,
        experiments=() if reason else (row.experiment,),
        measure=Measure(a={"engine": ["llama-bench"], "threads": [row.threads]},
                        field=row.test),
        fair=Fairness(models=(row.model,), device_class=row.board, allow_emulated=False),
        quantity=reason or "", note=row.note,
        setting=f"{row.model} {row.quant} on {row.board}, {row.threads} thread(s)")


def _claim(check: Checker, raw: Any, index: int, default_source: Any,
           experiments: dict[str, Any], default_setting: str = "") -> Claim:
    check = check.at(f"claim #{index + 1}")
    if not isinstance(raw, dict):
        raise check.fail("claim", "must be a table")
    if "id" in raw:
        claim_id = check.text(raw["id"], "id")
        if not NAME_RE.match(claim_id):
            raise check.fail("id", f"{claim_id!r}: use [a-z0-9][a-z0-9._-]*")
        check = check.at(f"claim '{claim_id}'")
    check.table(raw, "", CLAIM_KEYS)
    for key in ("id", "statement", "metric"):
        if key not in raw:
            raise check.fail(key, "required")
    if "source" not in raw and default_source is None:
        raise check.fail("source", "required (here or at the top of the file)")
    source = check.text(raw.get("source", default_source), "source")
    metric = check.text(raw["metric"], "metric")
    if metric not in METRICS:
        raise check.fail("metric", f"unknown metric {metric!r}; allowed: "
                         f"{', '.join(METRICS)}")
    expected = tolerance = rel_tolerance = None
    if "expected" in raw:
        expected = check.number(raw["expected"], "expected")
    at_least = check.number(raw["at_least"], "at_least") if "at_least" in raw else None
    at_most = check.number(raw["at_most"], "at_most") if "at_most" in raw else None
    if expected is not None and (at_least is not None or at_most is not None):
        raise check.fail("at_least" if at_least is not None else "at_most",
                         "give either expected (with a tolerance) or bounds, not both")
    if "tolerance" in raw and "rel_tolerance" in raw:
        raise check.fail("rel_tolerance", "give either tolerance or rel_tolerance")
    if "tolerance" in raw:
        tolerance = check.number(raw["tolerance"], "tolerance", low=0)
    if "rel_tolerance" in raw:
        rel_tolerance = check.number(raw["rel_tolerance"], "rel_tolerance", low=0)
    experiment, experiments = None, ()
    if metric == "reported":
        if "quantity" not in raw:
            raise check.fail("quantity", "required for metric 'reported' (what the "
                             "source measured)")
    else:
        if expected is None and at_least is None and at_most is None:
            raise check.fail("expected", f"required for metric {metric!r} (or the "
                             "bounds at_least / at_most)")
        if expected is not None and tolerance is None and rel_tolerance is None:
            raise check.fail("tolerance", "required (or rel_tolerance)")
    if metric != "reported" and metric not in COMPUTED_METRICS:
        if "experiment" not in raw:
            raise check.fail("experiment", "required: the name of an [experiment.NAME] "
                             "of this file or of an experiment in the store")
        names = raw["experiment"] if isinstance(raw["experiment"], list) else [raw["experiment"]]
        experiments = tuple(check.text(n, "experiment") for n in names)
        for name in experiments or ("",):
            if not NAME_RE.match(name):
                raise check.fail("experiment", f"{name!r}: use [a-z0-9][a-z0-9._-]*")
        experiment = experiments[0]
    measure = _measure(check, raw.get("measure", {}), metric)
    fair = _fairness(check, raw.get("fair", {}), metric)
    bounded = expected is None and (at_least is not None or at_most is not None)
    kind = check.text(raw.get("kind", "relation" if bounded else "direct"), "kind")
    if kind not in KINDS:
        raise check.fail("kind", f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "analogue" and "differs" not in raw:
        raise check.fail("differs", "required for kind 'analogue' (what differs from "
                         "the article's setting)")
    strength = check.text(raw.get("strength", ""), "strength") if "strength" in raw else ""
    if strength and strength not in STRENGTHS:
        raise check.fail("strength", f"unknown strength {strength!r}; allowed: "
                         f"{', '.join(STRENGTHS)}")
    mutant = check.text(raw["mutant"], "mutant") if "mutant" in raw else ""
    if mutant and mutant not in MUTANTS:
        raise check.fail("mutant", f"unknown mutant {mutant!r}; allowed: {', '.join(MUTANTS)}")
    return Claim(
        id=check.text(raw["id"], "id"), source=source,
        statement=check.text(raw["statement"], "statement"), metric=metric,
        expected=expected, tolerance=tolerance, rel_tolerance=rel_tolerance,
        at_least=at_least, at_most=at_most,
        unit=str(raw.get("unit", "")), experiment=experiment, measure=measure, fair=fair,
        quantity=str(raw.get("quantity", "")), note=str(raw.get("note", "")),
        quote=check.text(raw.get("quote", ""), "quote") if "quote" in raw else "",
        kind=kind, setting=str(raw.get("setting", default_setting)),
        differs=str(raw.get("differs", "")), experiments=experiments, strength=strength,
        article=str(raw.get("article", "")), gloss=str(raw.get("gloss", "")), mutant=mutant,
        precondition=(_precondition(check, raw["precondition"]) if "precondition" in raw
                      else None))


def _precondition(check: Checker, raw: Any) -> Precondition:
    table = check.table(raw, "precondition", PRECONDITION_KEYS)
    for key in ("what", "metric", "measure"):
        if key not in table:
            raise check.fail(f"precondition.{key}", "required")
    metric = check.text(table["metric"], "precondition.metric")
    if metric not in METRICS or metric in COMPUTED_METRICS or metric == "reported":
        raise check.fail("precondition.metric", f"{metric!r} is not a metric measured on runs")
    bounds = {k: check.number(table[k], f"precondition.{k}") for k in ("at_least", "at_most")
              if k in table}
    if not bounds:
        raise check.fail("precondition.at_least", "give at_least and/or at_most")
    return Precondition(what=check.text(table["what"], "precondition.what"), metric=metric,
                        measure=_measure(check, table["measure"], metric),
                        why=str(table.get("why", "")), **bounds)


def _measure(check: Checker, raw: Any, metric: str) -> Measure:
    table = check.table(raw, "measure", MEASURE_KEYS)
    if metric == "reported":
        return Measure()
    if metric in COMPUTED_METRICS:
        return Measure(params=params(check, table.get("params", {}), "measure.params"))
    if "a" not in table:
        raise check.fail("measure.a", "required: the runs to measure, e.g. "
                         "{ policy = \"sparse\", k = 32 }")
    if metric in TWO_CONFIG_METRICS and "b" not in table:
        raise check.fail("measure.b", f"required for metric {metric!r} (it compares "
                         "two configs, a and b)")
    fields = RANK_FIELDS if metric == "key_rank" else TIME_FIELDS
    field_name = table.get("field", fields[0] if metric == "key_rank" else
                           "decode_ms_per_token")
    for key in ("field", "field_b"):
        name = table.get(key, field_name)
        if name not in fields:
            kind = "key-ranking figure" if metric == "key_rank" else "timing"
            raise check.fail(f"measure.{key}", f"unknown {kind} {name!r}; allowed: "
                             f"{', '.join(fields)}")
    layers = check.table(table.get("params", {}), "measure.params",
                         {"layer_a", "layer_b"} if metric == "key_rank" else set())
    return Measure(
        params={k: int(check.number(v, f"measure.params.{k}", low=0))
                for k, v in layers.items()},
        a=selector(check, table["a"], "measure.a"),
        b=selector(check, table.get("b", {}), "measure.b"),
        baseline=(selector(check, table["baseline"], "measure.baseline")
                  if "baseline" in table else None),
        baseline_min_recall=check.number(table.get("baseline_min_recall", 0.9),
                                         "measure.baseline_min_recall", low=0),
        field=field_name, field_b=table.get("field_b", ""))


def _fairness(check: Checker, raw: Any, metric: str) -> Fairness:
    table = check.table(raw, "fair", FAIR_KEYS)
    models = table.get("model", ANY)
    models = models if isinstance(models, list) and models else [models]
    context = None
    if "context" in table:
        context = int(check.number(table["context"], "fair.context", low=1))
    allow = table.get("allow_emulated", metric not in ("time", "time_ratio"))
    if not isinstance(allow, bool):
        raise check.fail("fair.allow_emulated", f"must be true or false, got {allow!r}")
    return Fairness(
        models=tuple(check.text(m, "fair.model") for m in models),
        device_class=check.text(table.get("device_class", ANY), "fair.device_class"),
        context=context,
        context_tolerance=check.number(table.get("context_tolerance", 0.05),
                                       "fair.context_tolerance", low=0),
        allow_emulated=allow)
