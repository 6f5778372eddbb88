"""The audit's outputs: a verdict table for the terminal, audit.md, and a report section."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import pandas as pd

from reports.audit.verdict import Verdict
from reports.outdir import output_dir
from reports.render import Section
from reports.tables import CSS, markdown_text, to_markdown

COLUMNS = ["claim", "verdict", "measured", "expected", "evidence runs", "reason"]


def _evidence_text(ids: list[int]) -> str:
    if len(ids) <= 8:
        return " ".join(map(str, ids))
    return " ".join(map(str, ids[:8])) + f" ... ({len(ids)} runs)"


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    rows = [{
        "claim": v.claim.id, "verdict": v.verdict, "measured": v.measured_text,
        "expected": v.claim.expected_text(),
        "evidence runs": _evidence_text(v.evidence), "reason": v.reason,
    } for v in verdicts]
    return pd.DataFrame(rows, columns=COLUMNS)


def terminal_table(verdicts: list[Verdict]) -> str:
    """One line per claim: id, verdict, measured, expected; reasons below."""
    table = verdict_table(verdicts)
    width = max([len(c) for c in table["claim"]] + [5])
    lines = [f"{'claim':<{width}}  {'verdict':<15} {'measured':<28} expected"]
    for row in table.itertuples(index=False):
        lines.append(f"{row.claim:<{width}}  {row.verdict:<15} {row.measured:<28} {row.expected}")
    lines.append("")
    lines += [f"{v.claim.id}: {v.reason}" for v in verdicts]
    counts = pd.Series([v.verdict for v in verdicts]).value_counts().sort_index()
    lines.append("")
    lines.append("; ".join(f"{n} {name}" for name, n in counts.items()))
    return "\n".join(lines)


def audit_markdown(title: str, verdicts: list[Verdict]) -> str:
    out = [f"# {title}\n", to_markdown(verdict_table(verdicts)), "## Claims\n"]
    for v in verdicts:
        c = v.claim
        out.append(f"### {markdown_text(c.id)}: {v.verdict}\n")
        out.append(f"- statement: {markdown_text(c.statement)}")
        out.append(f"- source: {markdown_text(c.source)}")
        out.append(f"- metric: {c.metric}" + (f" ({c.quantity})" if c.quantity else ""))
        if c.expected_text():
            out.append(f"- expected: {c.expected_text()}")
        if v.measured_text:
            out.append(f"- measured: {markdown_text(v.measured_text)}")
        out.append(f"- reason: {markdown_text(v.reason)}")
        if v.experiment:
            runs = " ".join(map(str, v.evidence)) or "none"
            out.append(f"- evidence: experiment {v.experiment}, runs {runs}")
        if c.note:
            out.append(f"- note: {markdown_text(c.note)}")
        out.append("")
    return "\n".join(out)


def audit_html(verdicts: list[Verdict]) -> str:
    """The verdict table as HTML, each verdict coloured, each statement in a tooltip."""
    rows = []
    for v, row in zip(verdicts, verdict_table(verdicts).itertuples(index=False), strict=True):
        css = "verdict-" + v.verdict.replace(" ", "-")
        rows.append(
            f'<tr><td title="{escape(v.claim.statement)}">{escape(row.claim)}</td>'
            f'<td class="{css}"><b>{escape(row.verdict)}</b></td><td>{escape(row.measured)}</td>'
            f"<td>{escape(row.expected)}</td><td>{escape(row[4])}</td>"
            f'<td style="text-align:left">{escape(row.reason)}</td></tr>')
    header = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    return (f'<table id="table-audit"><thead><tr>{header}</tr></thead><tbody>'
            + "\n".join(rows) + "</tbody></table>")


def audit_json(verdicts: list[Verdict]) -> str:
    return json.dumps([{
        "claim": v.claim.id, "source": v.claim.source, "statement": v.claim.statement,
        "metric": v.claim.metric, "expected": v.claim.expected,
        "tolerance": v.claim.tolerance, "rel_tolerance": v.claim.rel_tolerance,
        "at_least": v.claim.at_least, "at_most": v.claim.at_most,
        "verdict": v.verdict, "measured": v.measured, "reason": v.reason,
        "experiment": v.experiment, "evidence": v.evidence,
    } for v in verdicts], indent=2, sort_keys=True) + "\n"


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
                   "Published claims against what this farm measured. Not comparable: the claim "
                   "is about a model or device this farm cannot run, or the evidence is not fair "
                   "(emulated timings, another context length, a baseline that fails).",
                   html_extra=audit_html(verdicts),
                   markdown_extra=to_markdown(verdict_table(verdicts)))
