"""The audit's outputs: a verdict table for the terminal, audit.md, audit.json, audit.html and a
report section. Each leads with the summary ("figures reproduced: X of Y checkable", then each
grade counted apart: reports.audit.grade), then one row per claim ordered by grade: the
article's figure and setting, ours, the grade, its kind and its evidence; each claim opens to
the article's sentence, our reading, the reason, the note and the evidence."""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from pathlib import Path

import pandas as pd

from reports.audit.grade import GRADES, figures_line, strength_of
from reports.audit.provenance import NOTHING
from reports.audit.verdict import Verdict
from reports.outdir import output_dir
from reports.render import Section
from reports.tables import CSS, markdown_text, to_markdown

COLUMNS = ["claim", "article's figure", "article's setting", "our figure", "our setting",
           "grade", "kind", "evidence"]


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


def article_figure(v: Verdict) -> str:
    """The article's own number for the claim (``article``); else a figure's or an arithmetic's
    range, which is the article's number with its rounding; else a quoted figure's statement."""
    c = v.claim
    if c.article:
        return c.article
    if strength_of(c) in ("figure", "arithmetic") and c.expected_text():
        return c.expected_text()
    return c.statement if c.metric == "reported" else "-"


def by_grade(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts in the order of their grades (checkable first), else in the file's."""
    return sorted(verdicts, key=lambda v: GRADES.index(v.grade))


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    rows = [{
        "claim": v.claim.id, "article's figure": article_figure(v),
        "article's setting": v.claim.setting or "-", "our figure": our_figure(v),
        "our setting": our_setting(v), "grade": v.grade, "kind": v.kind,
        "evidence": (f"{_runs_text(v.runs)}; {v.evidence.revision}"
                     if v.evidence is not None and v.evidence.model != NOTHING
                     else _runs_text(v.runs)),
    } for v in by_grade(verdicts)]
    return pd.DataFrame(rows, columns=COLUMNS)


def summary(verdicts: list[Verdict]) -> str:
    """"figures reproduced: X of Y checkable", then every grade counted apart (sanity checks
    last, never counted as reproduced)."""
    counts = Counter(v.grade for v in verdicts)
    parts = [f"{counts[g]} {g}" for g in GRADES if counts[g]]
    return figures_line([(v.claim, v.grade) for v in verdicts]) + "; " + "; ".join(parts)


def terminal_table(verdicts: list[Verdict]) -> str:
    """One line per claim: id, grade, kind, ours, the article's; reasons below; the counts."""
    ordered = by_grade(verdicts)
    width = max([len(v.claim.id) for v in verdicts] + [5])
    lines = [summary(verdicts), "",
             f"{'claim':<{width}}  {'grade':<22} {'kind':<9} {'measured':<30} article"]
    for v in ordered:
        lines.append(f"{v.claim.id:<{width}}  {v.grade:<22} {v.kind:<9} "
                     f"{our_figure(v):<30} {article_figure(v)}")
    lines.append("")
    lines += [f"{v.claim.id}: {v.reason}" for v in ordered]
    lines += ["", summary(verdicts)]
    return "\n".join(lines)


def evidence_text(v: Verdict) -> str:
    """The evidence in words: experiment, runs, units, model, device (with its load), data,
    engine revision."""
    units = f"{v.units.count} independent unit(s): {v.units.what}; " if v.units else ""
    if v.evidence is None or v.evidence.model == NOTHING:
        return units + _runs_text(v.runs)
    e = v.evidence
    where = f"experiment {v.experiment}, {_runs_text(v.runs)}; " if v.experiment else ""
    return (f"{where}{units}model {e.model}; device {e.device}; data {e.data}; "
            f"revision {e.revision}")


def details(v: Verdict) -> list[tuple[str, str]]:
    """What a reader needs to judge one claim, as (label, text), the empty ones left out."""
    c = v.claim
    rows = [("the article's sentence", c.quote), ("in English", c.gloss or
                                                  (f"(our statement) {c.statement}" if c.quote
                                                   else "")),
            ("our reading", c.statement), ("source", c.source),
            ("the article's figure", article_figure(v)),
            ("the article's setting", c.setting),
            ("judged as", f"{strength_of(c)} check; range {c.expected_text()}"),
            ("what differs here", c.differs), ("ours", our_figure(v)),
            ("grade", f"{v.grade} (outcome {v.verdict})"),
            ("precondition", v.precondition), ("mutant", c.mutant and
                                               f"{c.mutant} (tests/audit/test_mutants.py)"),
            ("reason", v.reason), ("note", c.note), ("evidence", evidence_text(v))]
    return [(label, text) for label, text in rows if text and text != "-"]


def audit_markdown(title: str, verdicts: list[Verdict]) -> str:
    out = [f"# {title}\n", summary(verdicts) + "\n", to_markdown(verdict_table(verdicts)),
           "## Claims\n"]
    for v in by_grade(verdicts):
        out.append(f"### {markdown_text(v.claim.id)}: {v.grade} ({v.kind})\n")
        out += [f"- {label}: {markdown_text(text)}" for label, text in details(v)]
        out.append("")
    return "\n".join(out)


def audit_html(verdicts: list[Verdict]) -> str:
    """The verdict table as HTML, each grade coloured; each claim opens (a <details>) to the
    article's sentence, our reading, both figures, the grade, reason, note and evidence."""
    rows = []
    ordered = by_grade(verdicts)
    for v, row in zip(ordered, verdict_table(verdicts).itertuples(index=False), strict=True):
        css = "verdict-" + v.grade.replace(" ", "-").replace(",", "")
        cells = [f"<td>{escape(str(value))}</td>" for value in row]
        body = "".join(f"<dt>{escape(label)}</dt><dd>{escape(text)}</dd>"
                       for label, text in details(v))
        cells[0] = (f"<td><details><summary>{escape(row[0])}</summary><dl>{body}</dl>"
                    "</details></td>")
        cells[5] = f'<td class="{css}" title="{escape(v.reason)}"><b>{escape(row[5])}</b></td>'
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    return (f'<p>{escape(summary(verdicts))}</p><table id="table-audit"><thead><tr>{header}'
            "</tr></thead><tbody>" + "\n".join(rows) + "</tbody></table>")


def audit_records(verdicts: list[Verdict]) -> list[dict]:
    """One object per claim: ``benchfarm audit --json`` and audit.json."""
    return [{
        "claim": v.claim.id, "source": v.claim.source, "statement": v.claim.statement,
        "quote": v.claim.quote, "gloss": v.claim.gloss, "article": article_figure(v),
        "setting": v.claim.setting, "metric": v.claim.metric, "kind": v.kind,
        "strength": strength_of(v.claim), "grade": v.grade, "verdict": v.verdict,
        "mutant": v.claim.mutant or None,
        "precondition": ({"what": v.claim.precondition.what, "measured": v.precondition,
                          "absent": v.precondition_absent}
                         if v.claim.precondition is not None else None),
        "units": v.units.as_dict() if v.units is not None else None,
        "expected": v.claim.expected_text(), "expected_value": v.claim.expected,
        "tolerance": v.claim.tolerance, "rel_tolerance": v.claim.rel_tolerance,
        "at_least": v.claim.at_least, "at_most": v.claim.at_most,
        "measured": v.measured, "noise": v.noise, "reason": v.reason, "note": v.claim.note,
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
                   "Published claims against what this farm measured, each graded by what it "
                   "shows: reproduced (the article's own figure), direction holds (its sign "
                   "only), consistent (its own arithmetic), verified (a rule, with a mutant "
                   "that flips it), sanity apart; precondition absent, inconclusive and not "
                   "comparable (a model or device this farm cannot run, or unfair evidence).",
                   html_extra=audit_html(verdicts),
                   markdown_extra=summary(verdicts) + "\n\n" + to_markdown(verdict_table(verdicts)))
