"""The audit's outputs: a verdict table for the terminal, audit.md, audit.json, audit.html and a
report section. Each leads with one row per claim: the article's figure and setting, ours, the
verdict, its kind and its evidence; the summary counts verdicts per kind (sanity checks apart,
outside the reproduced count)."""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from pathlib import Path

import pandas as pd

from reports.audit.claims_file import KINDS
from reports.audit.provenance import NOTHING
from reports.audit.verdict import REPRODUCED, VERDICTS, Verdict
from reports.outdir import output_dir
from reports.render import Section
from reports.tables import CSS, markdown_text, to_markdown

COLUMNS = ["claim", "article's figure", "article's setting", "our figure", "our setting",
           "verdict", "kind", "evidence"]


def _runs_text(ids: list[int]) -> str:
    if not ids:
        return "no runs"
    if len(ids) <= 8:
        return "runs " + " ".join(map(str, ids))
    return "runs " + " ".join(map(str, ids[:8])) + f" ... ({len(ids)} runs)"


def our_figure(v: Verdict) -> str:
    if v.measured is None:
        return v.measured_text or "-"
    noise = f" ± {v.noise:.2g}" if v.noise else ""
    return f"{v.measured_text}{noise}".strip()


def our_setting(v: Verdict) -> str:
    if v.evidence is None or v.evidence.model == NOTHING:
        return "-"
    differs = f" (differs: {v.claim.differs})" if v.claim.differs else ""
    return v.evidence.short() + differs


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    rows = [{
        "claim": v.claim.id, "article's figure": v.claim.expected_text() or "-",
        "article's setting": v.claim.setting or "-", "our figure": our_figure(v),
        "our setting": our_setting(v), "verdict": v.verdict, "kind": v.kind,
        "evidence": (f"{_runs_text(v.runs)}; {v.evidence.revision}"
                     if v.evidence is not None and v.evidence.model != NOTHING
                     else _runs_text(v.runs)),
    } for v in verdicts]
    return pd.DataFrame(rows, columns=COLUMNS)


def summary(verdicts: list[Verdict]) -> str:
    """Verdicts counted per kind; sanity checks apart (never counted as reproduced)."""
    counted = [v for v in verdicts if v.kind != "sanity"]
    parts = []
    for name in VERDICTS:
        kinds = Counter(v.kind for v in counted if v.verdict == name)
        if kinds:
            by_kind = ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k])
            parts.append(f"{sum(kinds.values())} {name} ({by_kind})")
    sanity = [v for v in verdicts if v.kind == "sanity"]
    if sanity:
        passed = sum(v.verdict == REPRODUCED for v in sanity)
        parts.append(f"sanity checks (not counted): {passed} of {len(sanity)} hold")
    return "; ".join(parts)


def terminal_table(verdicts: list[Verdict]) -> str:
    """One line per claim: id, verdict, kind, ours, the article's; reasons below; the counts."""
    width = max([len(v.claim.id) for v in verdicts] + [5])
    lines = [f"{'claim':<{width}}  {'verdict':<15} {'kind':<9} {'measured':<30} expected"]
    for v in verdicts:
        lines.append(f"{v.claim.id:<{width}}  {v.verdict:<15} {v.kind:<9} "
                     f"{our_figure(v):<30} {v.claim.expected_text()}")
    lines.append("")
    lines += [f"{v.claim.id}: {v.reason}" for v in verdicts]
    lines += ["", summary(verdicts)]
    return "\n".join(lines)


def audit_markdown(title: str, verdicts: list[Verdict]) -> str:
    out = [f"# {title}\n", summary(verdicts) + "\n", to_markdown(verdict_table(verdicts)),
           "## Claims\n"]
    for v in verdicts:
        c = v.claim
        out.append(f"### {markdown_text(c.id)}: {v.verdict} ({v.kind})\n")
        out.append(f"- statement: {markdown_text(c.statement)}")
        out.append(f"- source: {markdown_text(c.source)}")
        out.append(f"- metric: {c.metric}" + (f" ({c.quantity})" if c.quantity else ""))
        if c.expected_text():
            out.append(f"- expected: {c.expected_text()}")
        if c.setting:
            out.append(f"- the article's setting: {markdown_text(c.setting)}")
        if c.differs:
            out.append(f"- what differs here: {markdown_text(c.differs)}")
        if v.measured_text:
            out.append(f"- measured: {markdown_text(our_figure(v))}")
        out.append(f"- reason: {markdown_text(v.reason)}")
        if v.evidence is not None and v.evidence.model != NOTHING:
            e = v.evidence
            where = f"experiment {v.experiment}, {_runs_text(v.runs)}; " if v.experiment else ""
            out.append(f"- evidence: {where}model "
                       f"{markdown_text(e.model)}; device {markdown_text(e.device)}; data "
                       f"{markdown_text(e.data)}; revision {markdown_text(e.revision)}")
        if c.note:
            out.append(f"- note: {markdown_text(c.note)}")
        out.append("")
    return "\n".join(out)


def audit_html(verdicts: list[Verdict]) -> str:
    """The verdict table as HTML, each verdict coloured, each statement and reason in a
    tooltip."""
    rows = []
    for v, row in zip(verdicts, verdict_table(verdicts).itertuples(index=False), strict=True):
        css = "verdict-" + v.verdict.replace(" ", "-")
        cells = [f"<td>{escape(str(value))}</td>" for value in row]
        cells[0] = f'<td title="{escape(v.claim.statement)}">{escape(row[0])}</td>'
        cells[5] = f'<td class="{css}" title="{escape(v.reason)}"><b>{escape(row[5])}</b></td>'
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    return (f'<p>{escape(summary(verdicts))}</p><table id="table-audit"><thead><tr>{header}'
            "</tr></thead><tbody>" + "\n".join(rows) + "</tbody></table>")


def audit_records(verdicts: list[Verdict]) -> list[dict]:
    """One object per claim: ``benchfarm audit --json`` and audit.json."""
    return [{
        "claim": v.claim.id, "source": v.claim.source, "statement": v.claim.statement,
        "metric": v.claim.metric, "kind": v.kind, "verdict": v.verdict,
        "expected": v.claim.expected_text(), "expected_value": v.claim.expected,
        "tolerance": v.claim.tolerance, "rel_tolerance": v.claim.rel_tolerance,
        "at_least": v.claim.at_least, "at_most": v.claim.at_most,
        "measured": v.measured, "noise": v.noise, "reason": v.reason,
        "experiment": v.experiment, "differs": v.claim.differs,
        "evidence": {**(v.evidence.as_dict() if v.evidence is not None else {}),
                     "runs": v.runs},
    } for v in verdicts]


def audit_json(verdicts: list[Verdict]) -> str:
    return json.dumps(audit_records(verdicts), indent=2, sort_keys=True) + "\n"


def write_audit(out_dir: str | Path, title: str, verdicts: list[Verdict]) -> Path:
    """audit.md, audit.json and a standalone audit.html in ``out_dir``; returns audit.md."""
    out = output_dir(out_dir)
    (out / "audit.md").write_text(audit_markdown(title, verdicts), encoding="utf-8")
    (out / "audit.json").write_text(audit_json(verdicts), encoding="utf-8")
    (out / "audit.html").write_text(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n{audit_html(verdicts)}\n</body></html>\n", encoding="utf-8")
    return out / "audit.md"


def audit_section(title: str, verdicts: list[Verdict]) -> Section:
    """The audit as a section of the HTML report (``render_report(..., extra_sections=...)``)."""
    return Section("audit", title,
                   "Published claims against what this farm measured, each verdict with its "
                   "kind (direct, analogue, relation, verified, sanity) and its evidence. Not "
                   "comparable: the claim is about a model or device this farm cannot run, or "
                   "the evidence is not fair (emulated timings, another context length, a "
                   "baseline that fails). Inconclusive: a relation within our noise.",
                   html_extra=audit_html(verdicts),
                   markdown_extra=summary(verdicts) + "\n\n" + to_markdown(verdict_table(verdicts)))
