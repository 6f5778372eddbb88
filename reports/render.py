"""`benchfarm report`: one experiment as index.html, report.md, CSVs and manifest.json.

Everything is computed from the stored rows, and rendering is deterministic: no timestamps, no
random ids, every table sorted; the same database gives byte-identical files. ``index.html`` is
self-contained (inline CSS and SVG, no scripts, no network fetches).
"""

from __future__ import annotations

import hashlib
import json
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from db.measurements import CURRENT, Selection
from db.records import FIGURE_UNITS
from reports import aggregate, eviction, figures
from reports.baseline import baseline_warning, cells_of_runs
from reports.comparisons import device_comparison, engine_comparison
from reports.headline import prefill_headline, what_this_shows
from reports.history import History, StepCache, timeline_section_parts
from reports.outdir import output_dir
from reports.revisions import NEWEST_REVISIONS, RevisionOrder, newest_revisions, revisions_in_order
from reports.roofline import roofline_table
from reports.runs import ExperimentData, load_experiment
from reports.sections import Section, Table
from reports.tables import CSS, summary_text, to_html, to_markdown, write_csv

# Columns of runs.csv: the raw per-run figures (timestamps and raw engine JSON left out); the
# engines' common figures in the order of db.records.Figures.
RUN_COLUMNS = [
    "run_id", "run_key", "measurement_id", "attempt", "started_at", "device", "device_class",
    "emulated", "command", "kind", "ctx", "depth",
    "seed", "length", "policy", "k", "block", "probes", "kv", "wq", "threads", "prefill_attn",
    "repeat", "status", "exit_code", *FIGURE_UNITS, "engine_ms", "overhead_ms", "recall",
    "same_as_exact", "ppl", "nll", "selection_mass", "oracle_recall", "max_abs_diff",
    "bytes_read", "attn_median_ms", "peak_rss_kb", "kv_allocated_bytes", "kv_resident_bytes",
    "build_binary_sha256", "workload_content_hash", "flags",
]



def _select(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame[[c for c in columns if c in frame.columns]]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(data: ExperimentData) -> dict[str, Any]:
    """What was run, with what, where; and how to re-run it."""
    runs = data.runs

    def unique(columns: list[str], subset: str) -> list[dict[str, Any]]:
        table = runs.dropna(subset=[subset])[columns].drop_duplicates()
        table = table.sort_values(columns, kind="mergesort", key=lambda c: c.astype(str))
        return [{k.split("_", 1)[1] if k.startswith(("build_", "model_", "workload_")) else k:
                 (None if pd.isna(v) else v) for k, v in row.items()}
                for row in table.to_dict("records")]

    first_runs = runs.sort_values("run_id").drop_duplicates(
        subset=["device", "kind", "ctx", "depth", "seed", "length", "config"])
    return {
        "experiment": data.name,
        "spec_sha256": data.spec_hash,
        "spec": data.spec_text,
        "engine_source_hashes": sorted(set(runs["build_source_hash"].dropna())),
        "revisions": sorted(set(runs["build_revision"].dropna())),
        "builds": unique(["build_target", "build_isa", "build_revision", "build_source_hash",
                          "build_compiler", "build_compiler_version", "build_cflags",
                          "build_binary_sha256"],
                         "build_binary_sha256"),
        "models": unique(["model_path", "model_sha256"], "model_sha256"),
        "workloads": unique(["workload_kind", "workload_content_hash", "workload_params"],
                            "workload_content_hash"),
        "devices": json.loads(aggregate.devices_table(runs, data.device_fingerprints)
                              .to_json(orient="records")),
        "run_counts": run_counts(runs),
        "reproduce": {
            "experiment": "benchfarm run SPEC  # the spec above, saved to a file",
            "runs": [f"benchfarm reproduce {int(r.run_id)}  # {r.device}: {r.kind} "
                     f"{_point(r)} {r.config}" for r in first_runs[
                         ["run_id", "device", "kind", "ctx", "depth", "seed", "length", "config"]
                     ].itertuples()],
        },
    }


def run_counts(runs: pd.DataFrame) -> dict[str, int]:
    """Runs (measurements read) per status, in status order."""
    return {s: int((runs["status"] == s).sum()) for s in sorted(set(runs["status"]))}


def _point(row: Any) -> str:
    parts = []
    for name in ("ctx", "depth", "seed", "length"):
        value = getattr(row, name)
        if value is not None and not pd.isna(value):
            parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
    return " ".join(parts)


def timing_display(timings: pd.DataFrame) -> pd.DataFrame:
    """The timings table as people read it: ``median [min, max]`` and CV in percent."""
    rows = []
    for row in timings.to_dict("records"):
        shown: dict[str, Any] = {k: row.get(k) for k in ("device", "kind", "ctx", "depth",
                                                          "seed", "length", "config")}
        shown["runs"] = f"{row['runs_ok']} ok" + (f", {row['runs_failed']} failed"
                                                  if row["runs_failed"] else "")
        for prefix, title in TIMING_DISPLAY:
            shown[title] = summary_text(row.get(f"{prefix}_median"), row.get(f"{prefix}_min"),
                                        row.get(f"{prefix}_max"))
            cv = row.get(f"{prefix}_cv") if prefix not in ("overhead_ms", "engine_ms") else None
            # one run has no spread: its CV is left empty, not 0 %
            shown[f"{title} CV"] = "" if cv is None or pd.isna(cv) else f"{100 * cv:.1f} %"
        shown["flags"] = row.get("flags") or ""
        rows.append(shown)
    return pd.DataFrame(rows)


def builds_display(builds: pd.DataFrame) -> pd.DataFrame:
    """Builds with hashes cut to 16 characters and flags as one line (the CSV has them whole)."""
    shown = builds.copy()
    for column in ("source_hash", "binary_sha256", "revision"):
        shown[column] = shown[column].map(lambda v: str(v)[:16])
    shown["cflags"] = shown["cflags"].map(lambda v: " ".join(json.loads(v))
                                          if isinstance(v, str) and v.startswith("[") else v)
    return shown


TIMING_DISPLAY = [("decode_ms", "decode ms/token"), ("attn_ms", "attention ms/token"),
                  ("prefill_ms", "prefill ms"), ("attn_median_ms", "attn-bench ms"),
                  ("engine_ms", "engine process ms"), ("overhead_ms", "harness overhead ms")]


def history_section(data: ExperimentData, order: list[str],
                    steps_cache: StepCache | None = None,
                    histories: list[History] | None = None) -> Section:
    figures, steps = timeline_section_parts(data.runs, order, steps_cache, histories)
    return Section("history", "History across revisions",
                   "Each metric per engine revision in commit order (medians over runs), one "
                   "timeline per metric and device; dashed red lines mark the steps beyond noise "
                   "found by reports/steps.py (a penalised piecewise-constant fit with AR(1) "
                   "noise), named in the table with their cause: a commit, or the board where the "
                   "engine code is the revision before's. Every other table keeps revisions "
                   "apart (rev= in the config).", tables=[Table("history_steps", steps)],
                   figures=figures)


UNIT_OF_REPLICATION = ("Unit of replication: the run (one engine process for one cell: prompt, "
                       "config, device and repeat); every n, spread and test is over runs, never "
                       "over the decode steps of one run.")


def build_sections(data: ExperimentData, revision_order: RevisionOrder | None = None,
                   steps_cache: StepCache | None = None,
                   revisions: int | None = NEWEST_REVISIONS,
                   histories: list[History] | None = None) -> list[Section]:
    """The report's sections; ``steps_cache`` keeps the steps of its history's series. The
    history follows every revision; the other sections show the newest ``revisions`` of them
    (None: all) in full, the manifest every run. ``histories``: the experiment's histories
    when the caller has made them already (reports.history.timeline_section_parts)."""
    order = revisions_in_order(data.runs, revision_order)
    shown = newest_revisions(data, order, revisions)
    everything, data = data, shown.data
    runs = data.runs
    needle = aggregate.needle_table(runs)
    sweep = aggregate.k_sweep_table(runs)
    latency = aggregate.latency_table(runs)
    ttft = aggregate.ttft_table(runs)
    selection = aggregate.selection_table(runs)
    timings = aggregate.timing_table(runs)
    builds = aggregate.builds_table(everything.runs)
    counts = ", ".join(f"{n} {s}" for s, n in run_counts(everything.runs).items())
    headline = " ".join(part for part in (what_this_shows(runs), prefill_headline(ttft))
                        if part)
    warning = baseline_warning(cells_of_runs(runs))
    # An experiment comparing devices or revisions answers that question first.
    comparisons = [engine_comparison(data), device_comparison(data),
                   history_section(everything, order, steps_cache, histories)]
    leading = [s for s in comparisons if s.has_content()]
    return [
        *([Section("revisions", "Revisions shown", shown.note(), always=True)]
          if shown.left_out else []),
        *([Section("warning", "Warning: the baseline failed", warning, always=True)]
          if warning else []),
        *leading,
        Section("what-this-shows", "What this shows", headline, always=bool(headline)),
        Section("manifest", "Manifest",
                f"{len(everything.runs)} runs ({counts}). {UNIT_OF_REPLICATION} Spec sha256 "
                f"{data.spec_hash}. The engine builds, models and devices below identify every "
                "run; manifest.json lists the workloads and a `benchfarm reproduce` line per "
                "cell.",
                tables=[Table("builds", builds, builds_display(builds)),
                        Table("devices", aggregate.devices_table(
                            everything.runs, everything.device_fingerprints))],
                always=True),
        Section("needle", "Needle in a haystack",
                "Recall (mean over seeds and repeats) per context length and needle depth; one "
                "grid per engine config and device.",
                tables=[Table("needle", needle)], figures=figures.needle_heatmaps(needle)),
        Section("k-sweep", "k-sweep",
                "Recall, tokens identical to exact attention (same prompt, device, repeat), "
                "perplexity and timings against the number of selected blocks k; exact "
                "attention is the dashed reference line; ppl_vs_exact_pct is a config's "
                "perplexity cost against exact attention on the same texts, in percent. "
                "Critical k: the smallest k whose recall matches exact, for it and every larger "
                "k measured.",
                tables=[Table("critical_k", aggregate.critical_k_table(sweep)),
                        Table("k_sweep", sweep)],
                figures=figures.k_sweep_charts(sweep)),
        Section("latency", "Latency breakdown",
                "Decode time per token split into attention and the rest of the step, against "
                "context length (medians over runs; min/max and CV in the table).",
                tables=[Table("latency", latency)], figures=figures.latency_charts(latency)),
        Section("ttft", "Time to first token",
                "The prompt's prefill (prefill_ms) per prompt length and config, median [min, "
                "max] over runs; vs_exact is exact prefill's median over this one's (same "
                "device, length and threads; above 1 is faster). Memory where the engine "
                "printed it (medians, MB): the process's peak RSS, the KV cache's bytes "
                "touched (resident) and reserved (allocated, virtual).",
                tables=[Table("ttft", ttft)], figures=figures.ttft_charts(ttft)),
        Section("roofline", "Share of the roofline",
                "What each decode and prefill time implies against what its board can do, as "
                "its health check measured it (devices check: memory read bandwidth by buffer "
                "size, FMA peak): bytes read per token over the time per token against the "
                "read bandwidth (models whose weights fit the caches are not judged), and the "
                "prefill's matrix operations against the FMA peak of its threads; medians "
                "over runs. A run beyond 110 % is impossible (a measurement bug) and left out "
                "of histories and alerts.",
                tables=[Table("roofline", roofline_table(runs, data.model_configs,
                                                         data.limits))]),
        Section("selection", "Selection quality",
                "Attention mass captured by the selected blocks and recall of the oracle's "
                "top-k blocks, per policy at equal k (runs with --measure-selection).",
                tables=[Table("selection", selection)],
                figures=figures.selection_charts(selection)),
        Section("eviction", "Eviction (KV budget)",
                "Perplexity when each head keeps at most kv_budget positions and drops the rest "
                "for good (lmc --kv-budget), by the policy's keep score; the cost against exact "
                "attention on the same texts, in percent (medians over the texts).",
                tables=[Table("eviction", eviction.eviction_table(runs))]),
        Section("key-ranking", "Key ranking (the eviction-prediction article's metrics)",
                "How well each policy's keep score orders the keys of a query against the true "
                "attention mass (ppl runs with engine.measure_keys; engine/keyrank.h): Spearman "
                "rho, recall of the true top-32 keys, mass inside the top 32, and mass lost "
                "when the half with the lowest scores is evicted. Medians over the texts.",
                tables=[Table("key_ranking", eviction.key_rank_table(runs))]),
        *(s for s in comparisons if not s.has_content()),
        Section("statistics", "Timings and flags",
                "Every timing per cell (one prompt, config and device) as median [min, max] and "
                "coefficient of variation over repeats. Flagged rows: CV > 5 %, throttling, a "
                "non-performance governor, a memory clock below its maximum, a loaded machine "
                "or low free memory before the run, emulated devices (timings are not the "
                "hardware's), failed runs.",
                tables=[Table("timings", timings, timing_display(timings))]),
        Section("failures", "Failed and unfinished runs",
                tables=[Table("failures", aggregate.failures_table(runs))], always=True),
    ]


def sections_html(sections: list[Section]) -> str:
    """The sections' HTML (figures, tables, extras), everything from the store escaped: the
    report's body, and the experiment page of ``benchfarm web``."""
    body = []
    for section in sections:
        body.append(f'<section id="{section.anchor}"><h2>{escape(section.title)}</h2>')
        if section.text:
            body.append(f'<p class="note">{escape(section.text)}</p>')
        if section.figures:
            body.append('<div class="figs">')
            for caption, svg in section.figures:
                body.append(f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>")
            body.append("</div>")
        body.append(section.html_extra)
        for table in section.tables:
            shown = table.shown
            if shown.empty and not section.always:
                continue
            html = to_html(shown, f"table-{table.name}", table.cells)
            if table.caption:
                html = f'<p class="note">{escape(table.caption)}</p>{html}'
            if len(shown) > COLLAPSE_ROWS:  # long tables fold away; the figures summarise them
                html = (f"<details><summary>{escape(table.name)} ({len(shown)} rows, "
                        f"{escape(table.name)}.csv)</summary>{html}</details>")
            else:
                html = f"<h3>{escape(table.name)}</h3>{html}"
            body.append(html)
        body.append("</section>")
    return "\n".join(body)


def _html_page(title: str, sections: list[Section]) -> str:
    toc = " · ".join(f'<a href="#{s.anchor}">{escape(s.title)}</a>' for s in sections)
    body = [f"<h1>{escape(title)}</h1>", f"<nav>{toc}</nav>", sections_html(sections)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


COLLAPSE_ROWS = 24


def _markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {title}\n"]
    for section in sections:
        out.append(f"## {section.title}\n")
        if section.text:
            out.append(section.text + "\n")
        if section.figures:
            out.append("Figures (in index.html): " + "; ".join(c for c, _ in section.figures)
                       + "\n")
        if section.markdown_extra:
            out.append(section.markdown_extra)
        for table in section.tables:
            if table.data.empty and not section.always:
                continue
            out.append(f"### {table.name}\n")
            if table.caption:
                out.append(table.caption + "\n")
            out.append(to_markdown(table.shown, table.cells))
    return "\n".join(out)


def render_report(store: Any, experiment: str, out_dir: str | Path,
                  extra_sections: list[Section] | None = None,
                  revision_order: RevisionOrder | None = None,
                  selection: Selection = CURRENT,
                  revisions: int | None = NEWEST_REVISIONS) -> Path:
    """Write the report of ``experiment`` into ``out_dir``; return the path of index.html.

    ``extra_sections`` (e.g. the audit, see ``reports.audit.report``) are appended;
    ``revision_order`` puts engine revisions in commit order (git's, which reports cannot
    ask), for the history's timelines; without it they follow the order of their first run;
    ``selection``: which measurements of each run (default: its latest ok one);
    ``revisions``: how many of the newest revisions the sections below the history show in
    full (None: every one; ``reports.revisions``).
    """
    data = load_experiment(store, experiment, selection)  # an unknown experiment fails here
    out = output_dir(out_dir)
    sections = build_sections(data, revision_order, store, revisions) + \
        list(extra_sections or [])
    shown = [s for s in sections if s.has_content()]  # every table still gets its CSV
    title = f"benchfarm report: {experiment}"
    files: dict[str, Path] = {}
    write_csv(_select(data.runs, RUN_COLUMNS), out / "runs.csv")
    files["runs.csv"] = out / "runs.csv"
    for section in sections:
        for table in section.tables:
            write_csv(table.data, out / f"{table.name}.csv")
            files[f"{table.name}.csv"] = out / f"{table.name}.csv"
    (out / "report.md").write_text(_markdown(title, shown), encoding="utf-8")
    files["report.md"] = out / "report.md"
    index = out / "index.html"
    index.write_text(_html_page(title, shown), encoding="utf-8")
    files["index.html"] = index
    document = manifest(data)
    document["files"] = {name: _sha256(path) for name, path in sorted(files.items())}
    (out / "manifest.json").write_text(json.dumps(document, indent=2, sort_keys=True,
                                                  default=str) + "\n", encoding="utf-8")
    return index
