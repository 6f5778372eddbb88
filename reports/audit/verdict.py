"""The audit: each claim gets a verdict (reproduced, not reproduced, inconclusive, not
comparable), of the claim's kind (direct, analogue, relation, verified, sanity), with its
evidence (``provenance``: model, device, data, revision, and the article's setting).

Order of judgement for one claim:
1. fairness before running: is the claimed model available here, a device of the claimed class?
   If not, the claim is "not comparable" and nothing runs (a claim about Qwen3-VL-8B is never
   judged on another model);
2. evidence: the runs of the claim's experiment, run by the harness through ``runner`` when the
   claims file defines it (only what is missing runs), else taken from the store as they are;
3. fairness of the evidence: emulated timings, device class, context length;
4. perplexity claims: the model must predict the workload's text (``checks_ppl.model_guard``);
5. the metric's check (``CHECK_OF_METRIC``) measures a value and the noise of our side (the 95 %
   half-width over independent units: distinct prompts, windows, seeds or inputs; a run's
   repeats of a deterministic computation and its retries are one unit). A relation is
   reproduced when the value's interval lies inside its bounds, not reproduced when it lies
   outside, and inconclusive when it straddles a bound or there were no independent units to
   measure the noise; a figure is reproduced when it lies within the claim's range widened by
   our noise, not reproduced when its whole interval misses the range, and inconclusive when
   our noise is wider than the claim's own tolerance. An inconclusive verdict says how many
   more units would decide it (``more_units``);
6. the claim's precondition, when it has one (``check_precondition``): a property of the model
   its mechanism needs, measured; absent, the grade is "precondition absent".

``Verdict.grade`` says what the outcome shows (reports.audit.grade).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from reports.audit import checks_ppl
from reports.audit.checks import CHECKS, COMPUTED_METRICS, ENGINE_METRICS, Check
from reports.audit.claim import ANY, Claim
from reports.audit.claims_file import ClaimsFile
from reports.audit.evidence import Reading, Units, select, units_of
from reports.audit.grade import grade
from reports.audit.provenance import Provenance, provenance
from reports.runs import flatten_runs, snapshots_by_run

REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE = "reproduced", "not reproduced", "not comparable"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_COMPARABLE)
# metric -> its check, for every metric reports measures itself (the harness provides the
# engine checks: reports does not run lmc)
CHECK_OF_METRIC: dict[str, Check] = {name: metric.check for name, metric in CHECKS.items()
                                     if metric.check is not None}
# runner(experiment name, spec fragment) -> the run keys of that experiment's matrix, after
# running whatever of it was missing. Provided by the harness (reports does not import it).
Runner = Callable[[str, dict[str, Any]], list[str]]


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    cls: str
    emulated: bool


@dataclass(frozen=True)
class Environment:
    """What this farm can run: the model(s) and the devices."""

    models: tuple[str, ...]  # model names (directory names, config names)
    devices: tuple[DeviceInfo, ...] = ()


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    measured: float | None = None
    measured_text: str = ""
    reason: str = ""
    runs: list[int] = field(default_factory=list)  # the ids of the runs it rests on
    experiment: str | None = None
    evidence: Provenance | None = None
    noise: float | None = None
    units: Units | None = None  # the independent units the figure rests on
    precondition: str = ""  # our figure of the claim's precondition, when it has one
    precondition_absent: bool = False

    @property
    def kind(self) -> str:
        return self.claim.kind

    @property
    def grade(self) -> str:
        """What the outcome shows (reports.audit.grade)."""
        return grade(self.claim, self.verdict, self.precondition_absent)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def precheck(claim: Claim, env: Environment) -> str | None:
    """Why the claim cannot be compared here before anything runs, or None."""
    fair = claim.fair
    available = {_norm(m) for m in env.models}
    if ANY not in fair.models and not available & {_norm(m) for m in fair.models}:
        return (f"the claim is about {' and '.join(fair.models)}, which benchfarm cannot run "
                f"here (models: {', '.join(env.models) or 'none'}); a number from another model "
                "is not comparable")
    if fair.device_class != ANY and env.devices:
        usable = [d for d in env.devices if d.cls == fair.device_class
                  and (fair.allow_emulated or not d.emulated)]
        if not usable:
            present = ", ".join(f"{d.name} ({d.cls}{', emulated' if d.emulated else ''})"
                                for d in env.devices)
            return (f"the claim was measured on {fair.device_class}; no usable device of that "
                    f"class here (devices: {present})")
    if claim.metric == "reported":
        return f"benchfarm does not measure {claim.quantity}"
    return None


def fair_runs(claim: Claim, runs: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The evidence runs that are fair for this claim, or the reason none are."""
    fair = claim.fair
    if runs.empty:
        return runs, "no runs stored for this claim's experiment"
    # Judge fairness on the runs the claim measures, not on the whole experiment.
    selectors = [s for s in (claim.measure.a, claim.measure.b, claim.measure.baseline) if s]
    if selectors:
        measured_ids = set().union(*(select(runs, s)["measurement_id"] for s in selectors))
        runs = runs[runs["measurement_id"].isin(measured_ids)]
    if runs.empty:
        return runs, "no runs in the experiment match the claim's configs"
    if ANY not in fair.models:
        names = runs["model_path"].fillna("").map(lambda p: _norm(str(p).rstrip("/")
                                                                  .rsplit("/", 1)[-1]))
        wanted = {_norm(m) for m in fair.models}
        # a GGUF converted by benchfarm is named after its model: <model>-<sha>-<type>.gguf
        converted = names.map(lambda n: n.endswith("gguf") and any(n.startswith(m)
                                                                  for m in wanted))
        runs = runs[names.isin(wanted) | converted]
        if runs.empty:
            return runs, f"no runs with the claimed model ({' or '.join(fair.models)})"
    if fair.device_class != ANY:
        runs = runs[runs["device_class"] == fair.device_class]
        if runs.empty:
            return runs, f"no runs on a {fair.device_class} device"
    if not fair.allow_emulated:
        real = runs[~runs["emulated"].astype(bool)]
        if real.empty:
            devices = ", ".join(sorted(set(runs["device"])))
            return real, (f"timings only from emulated devices ({devices}): an emulator's "
                          "timings say nothing about the hardware")
        runs = real
    if fair.context is not None:
        size = runs["prompt_tokens"].where(runs["prompt_tokens"].notna(),
                                           runs["ctx"].where(runs["ctx"].notna(), runs["length"]))
        size = pd.to_numeric(size, errors="coerce")
        close = (size - fair.context).abs() <= fair.context_tolerance * fair.context
        if not close.any():
            seen = sorted({int(s) for s in size.dropna()})
            return runs[close], (f"no runs at the claim's context of {fair.context} tokens "
                                 f"(± {100 * fair.context_tolerance:g} %); measured: {seen}")
        runs = runs[close]
    return runs, None


PPL_METRICS = ("ppl", "ppl_change")


def one_measurement_per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run once (its latest ok measurement, else its latest): a retry or a re-measurement
    of one run (``--all-measurements``) is not another independent unit."""
    if runs.empty or "run_id" not in runs:
        return runs
    ordered = runs.assign(_ok=runs["status"] == "ok").sort_values(["_ok", "measurement_id"])
    return (ordered.drop_duplicates("run_id", keep="last").drop(columns="_ok")
            .sort_values("run_id").reset_index(drop=True))


def judge(claim: Claim, runs: pd.DataFrame, experiment: str | None) -> Verdict:
    runs = one_measurement_per_run(runs)
    measured, reason = fair_runs(claim, runs)
    if not reason and claim.metric in PPL_METRICS:
        reason = checks_ppl.model_guard(measured, runs)
    if reason:
        return Verdict(claim, NOT_COMPARABLE, reason=reason, experiment=experiment,
                       evidence=provenance(claim, measured, []))
    verdict = verdict_of(claim, CHECK_OF_METRIC[claim.metric](claim, measured), measured,
                         experiment)
    if claim.precondition is not None and verdict.verdict != NOT_COMPARABLE:
        check_precondition(verdict, runs)
    return verdict


def check_precondition(verdict: Verdict, runs: pd.DataFrame) -> None:
    """Measure the claim's precondition on the experiment's runs; outside its bounds the
    verdict's grade is "precondition absent" and the reason leads with our figure of it."""
    claim = verdict.claim
    need = claim.precondition
    assert need is not None
    probe = dataclasses.replace(claim, metric=need.metric, measure=need.measure, expected=None,
                                tolerance=None, rel_tolerance=None, at_least=need.at_least,
                                at_most=need.at_most, unit="", precondition=None)
    reading = CHECK_OF_METRIC[need.metric](probe, runs)
    wanted = probe.expected_text()
    if reading.value is None:
        verdict.precondition = f"{need.what}: not measured ({reading.reason})"
        return
    verdict.precondition = f"{need.what}: {reading.text} (needs {wanted}; {reading.detail})"
    if not probe.within(reading.value):
        verdict.precondition_absent = True
        why = f" {need.why}" if need.why else ""
        verdict.reason = (f"precondition absent: {need.what} is {reading.text} here, the "
                          f"mechanism needs {wanted}.{why} The claim's own check: "
                          + verdict.reason)


def verdict_of(claim: Claim, reading: Reading, measured: pd.DataFrame,
               experiment: str | None) -> Verdict:
    used = (measured[measured["run_id"].isin(reading.evidence)]
            if len(measured) and reading.evidence else measured)
    verdict = Verdict(claim, NOT_COMPARABLE, reading.value, reading.text,
                      runs=reading.evidence, experiment=experiment,
                      evidence=reading.provenance
                      or provenance(claim, measured, reading.evidence),
                      noise=reading.noise, units=reading.units)
    if verdict.units is None:  # a check without runs that names none: what it rests on
        verdict.units = (units_of(used) if len(used) else
                         Units(0, f"none: {verdict.evidence.data}"))
    on = f"; evidence: {verdict.evidence.short()}"
    detail = f" ({reading.detail})" if reading.detail else ""
    if reading.reason or reading.value is None:
        verdict.reason = (reading.reason or "nothing was measured") + detail + on
        return verdict
    verdict.verdict, why = decide(claim, reading.value, reading.noise,
                                  verdict.units.count if verdict.units else 0)
    verdict.reason = why + detail + on
    return verdict


def more_units(units: int, noise: float, margin: float) -> str:
    """How many more independent units would bring a 95 % half-width of ``noise`` (over
    ``units`` of them) under ``margin``, if their spread held (the half-width falls as
    1/sqrt(n))."""
    if margin <= 0:
        return "no number of units decides a value on the bound itself"
    if units < 2:
        return "at least two independent units are needed to measure the noise at all"
    needed = math.ceil(units * (noise / margin) ** 2)
    return (f"about {max(needed - units, 1)} more independent units (than the {units} measured) "
            f"would decide it, if their spread held")


def decide(claim: Claim, value: float, noise: float | None,
           units: int = 0) -> tuple[str, str]:
    """The verdict on a measured value and its noise (see the module), and why."""
    low, high = claim.bounds()
    expected = claim.expected_text()
    shown = f"measured {value:.4g}" + (f" ± {noise:.2g} (95 %)" if noise else "")
    if claim.kind == "relation":
        if noise is None:
            return INCONCLUSIVE, (f"{shown}, but without independent paired repeats there is "
                                  f"no margin to tell it from the claimed {expected}")
        if low - 1e-12 <= value - noise and value + noise <= high + 1e-12:
            return REPRODUCED, f"{shown}: the whole interval is within the claimed {expected}"
        if value + noise < low or value - noise > high:
            return NOT_REPRODUCED, f"{shown}: the whole interval is outside the claimed {expected}"
        bound = low if abs(value - low) < abs(value - high) else high
        return INCONCLUSIVE, (f"{shown}: the interval straddles the claimed {expected}, a tie "
                              f"within our noise; {more_units(units, noise, abs(value - bound))}")
    # a figure: matched within the claim's tolerance (its rounding and readings) plus our
    # noise, as long as our noise is no wider than that tolerance
    allowed = noise or 0.0
    half = (high - low) / 2
    decisive = allowed <= half + 1e-12
    if value + allowed < low - 1e-12 or value - allowed > high + 1e-12:
        side = "below" if value < low else "above"
        return NOT_REPRODUCED, f"{shown}, {side} the claimed {expected} by more than our noise"
    if not decisive:
        return INCONCLUSIVE, (f"{shown}: our noise is wider than the claim's own tolerance "
                              f"({expected}); {more_units(units, allowed, half)}")
    if low - 1e-12 <= value <= high + 1e-12:
        return REPRODUCED, f"{shown}, within the claimed {expected}"
    return REPRODUCED, f"{shown}: the claimed {expected} is within our noise of it"


def load_runs_by_keys(store: Any, keys: list[str], selection: Any = None) -> pd.DataFrame:
    """The flattened runs with these run keys, from whichever experiments hold them.

    A run belongs to the experiment that first stored it (run keys are global), so the evidence
    of an audit experiment may sit in another experiment, e.g. the demo's.
    """
    wanted = set(keys)
    names = store.experiments_holding(wanted)
    frames = [stored_runs(store, name, selection) for name in names]
    if not frames:
        return pd.DataFrame()
    runs = pd.concat(frames, ignore_index=True)
    # one run, many experiments: each measurement once
    runs = runs[runs["run_key"].isin(wanted)].drop_duplicates("measurement_id")
    return runs.sort_values("run_id").reset_index(drop=True)


def stored_runs(store: Any, experiment: str, selection: Any = None) -> pd.DataFrame:
    """``selection``: which measurements of each run (db.measurements.Selection; default:
    its latest ok one)."""
    if experiment not in store.list_experiments():
        return pd.DataFrame()
    frames = store.frames(experiment, selection, summaries=True)
    runs = flatten_runs(frames["runs"], frames["outcomes"], frames["snapshots"])
    by_run = snapshots_by_run(frames["snapshots"])
    runs["load"] = [_load(by_run.get(int(m), {})) for m in runs["measurement_id"]]
    return runs


def _load(phases: dict[str, Any]) -> float | None:
    """The device's 1-minute load average when the run started (its snapshot before it)."""
    load = (phases.get("before") or {}).get("loadavg")
    try:
        return float(load[0])
    except (TypeError, IndexError, ValueError):
        return None


def computed(claim: Claim, engine_checks: dict[str, Check] | None) -> Verdict:
    """A claim judged without runs: arithmetic here, or the engine run by the harness."""
    check = CHECK_OF_METRIC.get(claim.metric) or (engine_checks or {}).get(claim.metric)
    if check is None:
        reason = ("this check runs the engine itself, which only `benchfarm audit` does (not "
                  "--stored-only or a report)" if claim.metric in ENGINE_METRICS else
                  f"no check for metric {claim.metric}")
        return Verdict(claim, NOT_COMPARABLE, reason=reason,
                       evidence=provenance(claim, pd.DataFrame(), []))
    return verdict_of(claim, check(claim, pd.DataFrame()), pd.DataFrame(), None)


def run_audit(claims: ClaimsFile, store: Any, env: Environment,
              runner: Runner | None = None,
              engine_checks: dict[str, Check] | None = None,
              selection: Any = None) -> list[Verdict]:
    """Judge every claim of ``claims``. With a ``runner``, experiments defined in the claims file
    are run (what is missing) before judging; without, stored runs are used as they are.
    ``engine_checks`` (metric -> check) judge the claims that run the engine directly;
    ``selection`` says which measurements of each run are the evidence (db.measurements)."""
    evidence: dict[str, pd.DataFrame] = {}
    verdicts = []
    for claim in claims.claims:
        reason = precheck(claim, env)
        if reason:
            verdicts.append(Verdict(claim, NOT_COMPARABLE, reason=reason,
                                    evidence=provenance(claim, pd.DataFrame(), [])))
            continue
        if claim.metric in COMPUTED_METRICS:
            verdicts.append(computed(claim, engine_checks))
            continue
        for name in claim.experiments:
            if name not in evidence:
                runs = pd.DataFrame()
                if runner is not None and name in claims.experiments:
                    runs = load_runs_by_keys(store, runner(name, claims.experiments[name]),
                                             selection)
                if runs.empty:  # e.g. stored-only after the engine changed: other keys, same name
                    runs = stored_runs(store, name, selection)
                evidence[name] = runs
        frames = [evidence[n] for n in claim.experiments if not evidence[n].empty]
        runs = (pd.concat(frames, ignore_index=True).drop_duplicates("measurement_id")
                if frames else pd.DataFrame())
        verdicts.append(judge(claim, runs, " + ".join(claim.experiments)))
    return verdicts
