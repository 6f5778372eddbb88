"""`benchfarm compare A B`: two devices, device classes or engine revisions, config by config.

For every config run on both sides (same workload point and engine config; when comparing
revisions also the same device): the median timing of each, the ratio B/A, a Mann-Whitney U test
with a noise threshold (``reports.stats.compare_samples``), and whether the generated tokens are
identical (else the first divergent step). Samples are the runs' per-token medians; with fewer
than 4 runs a side the decode steps of the runs are the samples instead (noted per row).

A/A mode (A == B) splits each config's repeats into even and odd and compares the halves: the
ratios it finds between identical configs are the noise floor, which then serves as threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from reports.cells import merge_flags, plain_key
from reports.cpu import mixed_cpu_flag
from reports.errors import ReportInputError
from reports.outdir import output_dir
from reports.runs import first_divergence, flatten_runs, without_revision
from reports.runs import generated_tokens as tokens
from reports.stats import NOISE_THRESHOLD, compare_samples, min_p_value, noise_floor
from reports.tables import CSS, to_html, to_markdown, write_csv

POINT = ["command", "kind", "ctx", "depth", "seed", "length"]
MIN_RUN_SAMPLES = 4
DIRTY = "+dirty"  # a stored revision's suffix: the working tree, with engine changes
STEP_FIELDS = {"decode_ms_per_token": "ms", "attn_ms_per_token": "attn_ms"}
COLUMNS = POINT[1:] + ["config", "device", "n_a", "n_b", "samples", "median_a", "median_b",
                       "ratio", "p_value", "change", "tokens", "flags"]


@dataclass
class Side:
    text: str  # as the user wrote it
    kind: str  # device | class | revision
    mask: pd.Series


@dataclass
class Comparison:
    a: Side
    b: Side
    metric: str
    threshold: float
    noise_floor: float | None  # from A/A on side A, when measurable
    table: pd.DataFrame

    def summary(self) -> str:
        counts = self.table["change"].value_counts().sort_index() if len(self.table) else {}
        parts = [f"{n} {name}" for name, n in counts.items()]
        floor = "n/a" if self.noise_floor is None else f"{100 * self.noise_floor:.1f} %"
        return (f"{self.b.text} vs {self.a.text} ({self.metric}, ratio B/A): {len(self.table)} "
                f"common configs; {', '.join(parts) or 'nothing to compare'}; threshold "
                f"{100 * self.threshold:.1f} %; A/A noise floor of {self.a.text}: {floor}")


def load_runs(store: Any, experiments: list[str] | None) -> pd.DataFrame:
    names = experiments or store.list_experiments()
    frames, steps = [], []
    for name in names:
        raw = store.frames(name)
        frames.append(flatten_runs(raw["runs"], raw["outcomes"], raw["snapshots"]))
        steps.append(raw["token_timings"])
    if not frames:
        raise ReportInputError("the store holds no experiments to compare")
    # A run may belong to several experiments: count it once.
    runs = pd.concat(frames, ignore_index=True).drop_duplicates("run_id", ignore_index=True)
    runs.attrs["steps"] = pd.concat(steps, ignore_index=True).drop_duplicates(["run_id", "step"])
    return runs


def resolve(runs: pd.DataFrame, text: str, named: str | None = None) -> Side:
    """A device name, a device class, an engine (lmc, llama-bench), or an engine revision /
    source hash / binary sha256 (or their prefix). ``named``: what ``text`` names as a
    revision when it is none of the others (a git name resolved to its commit, ``worktree``
    to the working tree's source hash)."""
    for kind, column in (("device", "device"), ("class", "device_class"), ("engine", "engine")):
        mask = runs[column] == text
        if mask.any():
            return Side(text, kind, mask)
    for target in dict.fromkeys(t for t in (named, text) if t):
        for column in ("build_revision", "build_source_hash", "build_binary_sha256"):
            stored = runs[column].fillna("").astype(str)
            # a commit is not its working tree with local changes (<commit>+dirty)
            mask = stored.str.startswith(target) & (stored.str.endswith(DIRTY)
                                                    == target.endswith(DIRTY))
            if len(target) >= 4 and mask.any():
                shown = text if target == text else f"{text} ({target[:12]})"
                return Side(shown, "revision", mask)
    known = (sorted(set(runs["device"])) + sorted(set(runs["device_class"]))
             + sorted(set(runs["engine"])))
    raise ReportInputError(
        f"{text!r} is neither a device, a device class, an engine nor an engine revision in the "
        f"store; devices, classes and engines: {', '.join(dict.fromkeys(known))}; revisions: "
        f"{', '.join(sorted(set(runs['build_revision'].dropna())))}")


def _base_config(config: str) -> str:
    """The config label without the thread count (boards of two classes differ in threads) and
    without the revision (one experiment may hold several)."""
    return " ".join(part for part in without_revision(config).split()
                    if not part.startswith("t="))


def _samples(cell: pd.DataFrame, metric: str, steps: pd.DataFrame) -> tuple[list[float], str]:
    values = cell[metric].dropna().tolist()
    if len(values) >= MIN_RUN_SAMPLES or metric not in STEP_FIELDS or steps.empty:
        return values, "runs"
    own = steps[steps["run_id"].isin(cell["run_id"])][STEP_FIELDS[metric]].dropna().tolist()
    return (own, "steps") if len(own) > len(values) else (values, "runs")


def _tokens_text(cell_a: pd.DataFrame, cell_b: pd.DataFrame) -> str:
    ta = [tokens(v) for v in cell_a.sort_values("repeat")["generated_ids"]]
    tb = [tokens(v) for v in cell_b.sort_values("repeat")["generated_ids"]]
    ta, tb = [t for t in ta if t is not None], [t for t in tb if t is not None]
    if not ta or not tb:
        return ""
    step = first_divergence(ta[0], tb[0])
    return "identical" if step is None else f"diverge at step {step}"


def _row(key: dict[str, Any], cell_a: pd.DataFrame, cell_b: pd.DataFrame, metric: str,
         steps: pd.DataFrame, threshold: float, same_cpu: bool = False) -> dict[str, Any]:
    sample_a, kind_a = _samples(cell_a, metric, steps)
    sample_b, kind_b = _samples(cell_b, metric, steps)
    if kind_a != kind_b:  # compare like with like: both per run
        sample_a, sample_b = cell_a[metric].dropna().tolist(), cell_b[metric].dropna().tolist()
        kind_a = "runs"
    change = compare_samples(sample_a, sample_b, threshold)
    return key | {
        "n_a": len(sample_a), "n_b": len(sample_b), "samples": kind_a,
        "median_a": pd.Series(sample_a).median() if sample_a else None,
        "median_b": pd.Series(sample_b).median() if sample_b else None,
        "ratio": change.ratio, "p_value": change.p_value, "change": change.verdict,
        "tokens": _tokens_text(cell_a, cell_b), "flags": _side_flags(cell_a, cell_b, same_cpu)}


def _side_flags(cell_a: pd.DataFrame, cell_b: pd.DataFrame, same_cpu: bool) -> str:
    """Why either side's timings deserve distrust (emulated, governor, throttling, runs on more
    than one CPU model), and, where both sides should be the same hardware (revisions and
    engines on one device: ``same_cpu``), that their CPU models differ."""
    parts = [f"{side}: {flags}" for side, cell in (("A", cell_a), ("B", cell_b))
             if (flags := "; ".join(f for f in (merge_flags(cell["flags"]),
                                                mixed_cpu_flag(cell["cpu"])) if f))]
    if same_cpu and not mixed_cpu_flag(cell_a["cpu"]) and not mixed_cpu_flag(cell_b["cpu"]):
        across = mixed_cpu_flag([*cell_a["cpu"], *cell_b["cpu"]])
        if across:
            parts.append(f"A and B ran on different CPUs ({across.partition(': ')[2]})")
    return "; ".join(parts)


def _pairs(runs_a: pd.DataFrame, runs_b: pd.DataFrame, keys: list[str]):
    groups_b = {plain_key(k): g for k, g in runs_b.groupby(keys, dropna=False, sort=False)}
    for key, cell_a in runs_a.groupby(keys, dropna=False, sort=True):
        if plain_key(key) in groups_b:
            yield dict(zip(keys, key, strict=True)), cell_a, groups_b[plain_key(key)]


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    table = table.rename(columns={"base_config": "config"})
    columns = [c for c in COLUMNS if c in table.columns]  # no device column across devices
    return table[columns]


def aa_table(runs: pd.DataFrame, metric: str, steps: pd.DataFrame,
             threshold: float) -> pd.DataFrame:
    """Even against odd repeats of every config: what 'no change' looks like."""
    rows, keys = [], POINT + ["base_config", "device", "revision"]
    for key, cell in runs.groupby(keys, dropna=False, sort=True):
        even, odd = cell[cell["repeat"] % 2 == 0], cell[cell["repeat"] % 2 == 1]
        if even.empty or odd.empty:
            continue
        rows.append(_row(dict(zip(keys, key, strict=True)),
                         even, odd, metric, steps, threshold))
    return _table(rows)


def compare(store: Any, a: str, b: str, experiments: list[str] | None = None,
            metric: str = "decode_ms_per_token",
            threshold: float = NOISE_THRESHOLD, lmc_policy: str = "exact",
            named: dict[str, str] | None = None) -> Comparison:
    runs = load_runs(store, experiments)
    return compare_runs(runs, runs.attrs["steps"], a, b, metric, threshold, lmc_policy, named)


def compare_runs(runs: pd.DataFrame, steps: pd.DataFrame, a: str, b: str,
                 metric: str = "decode_ms_per_token",
                 threshold: float = NOISE_THRESHOLD, lmc_policy: str = "exact",
                 named: dict[str, str] | None = None) -> Comparison:
    """``compare`` on flattened runs (``reports.runs.flatten_runs``) and their steps.

    ``lmc_policy``: across engines, the lmc attention policy set against the other engine
    (exact by default: what another engine computes). ``named``: A or B -> the revision it
    names (see ``resolve``)."""
    if metric not in runs.columns:
        raise ReportInputError(f"unknown timing {metric!r}; allowed: decode_ms_per_token, "
                               "attn_ms_per_token, prefill_ms, attn_median_ms, engine_ms")
    runs = runs[runs["status"] == "ok"].copy()
    runs["base_config"] = runs["config"].map(_base_config)
    named = named or {}
    side_a, side_b = resolve(runs, a, named.get(a)), resolve(runs, b, named.get(b))
    if side_a.kind != side_b.kind:
        raise ReportInputError(f"{a!r} is a {side_a.kind} but {b!r} is a {side_b.kind}; compare "
                               "devices with devices, classes with classes, revisions with "
                               "revisions")
    # across devices or classes, the same engine revision on both sides: revisions never pool
    keys = POINT + ["base_config"] + (["device"] if side_a.kind == "revision" else ["revision"])
    if side_a.kind == "engine":
        runs, keys = _engine_neutral(runs, lmc_policy), POINT[1:] + ["base_config", "device"]
    runs_a = runs[side_a.mask.reindex(runs.index)]
    aa = aa_table(runs_a, metric, steps, threshold)
    floor = noise_floor(aa["ratio"]) if len(aa) else None
    if a == b:
        return Comparison(side_a, side_b, metric, threshold, floor, aa)
    used = max(threshold, floor or 0.0)
    same_cpu = side_a.kind in ("revision", "engine")  # one device on both sides of a pair
    rows = [_row(key, ca, cb, metric, steps, used, same_cpu)
            for key, ca, cb in _pairs(runs_a, runs[side_b.mask.reindex(runs.index)], keys)]
    return Comparison(side_a, side_b, metric, used, floor, _table(rows))


def _engine_neutral(runs: pd.DataFrame, lmc_policy: str) -> pd.DataFrame:
    """Across engines, a config is its weight format and threads on the same device and
    workload point; of lmc's policies only ``lmc_policy`` (exact attention, unless a sparse
    policy is what is being set against the other engine) takes part."""
    stored = sorted(set(runs["policy"].dropna()))  # only lmc's runs have a policy
    if stored and lmc_policy not in stored:
        raise ReportInputError(f"no lmc runs with policy {lmc_policy!r} to set against the other "
                               f"engine (--lmc-policy); stored policies: {', '.join(stored)}")
    runs = runs[runs["policy"].isna() | (runs["policy"] == lmc_policy)].copy()
    runs["base_config"] = [f"wq={w} t={int(t)}" for w, t in zip(runs["wq"], runs["threads"],
                                                                  strict=True)]
    return runs


def terminal_table(comparison: Comparison) -> str:
    shown = comparison.table.copy()
    for column in ("median_a", "median_b", "ratio", "p_value"):
        shown[column] = shown[column].map(lambda v: "" if v is None or pd.isna(v)
                                          else f"{v:.4g}")
    shown = shown.rename(columns={"median_a": f"A {comparison.a.text}",
                                  "median_b": f"B {comparison.b.text}"})
    shown = shown.loc[:, [c for c in shown.columns if shown[c].astype(str).str.len().any()]]
    text = shown.to_string(index=False, na_rep="") if len(shown) else "(no common configs)"
    note = (f"\nsignificance: Mann-Whitney U, alpha 0.05; with runs only, {MIN_RUN_SAMPLES}+ "
            f"per side are needed (min p for 3 vs 3 is {min_p_value(3, 3):.2f})")
    return text + "\n\n" + comparison.summary() + note


def write_comparison(comparison: Comparison, out_dir: str | Path) -> Path:
    """compare.csv, compare.md and a self-contained compare.html; returns the HTML path."""
    out = output_dir(out_dir)
    write_csv(comparison.table, out / "compare.csv")
    title = f"benchfarm compare: B = {comparison.b.text} vs A = {comparison.a.text}"
    (out / "compare.md").write_text(f"# {title}\n\n{comparison.summary()}\n\n"
                                    + to_markdown(comparison.table), encoding="utf-8")
    html = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{escape(title)}</title><style>{CSS}</style></head>\n<body>\n<h1>{escape(title)}"
            f"</h1>\n<p class=\"note\">{escape(comparison.summary())}</p>\n"
            f"{to_html(comparison.table, 'table-compare')}\n</body></html>\n")
    (out / "compare.html").write_text(html, encoding="utf-8")
    return out / "compare.html"
