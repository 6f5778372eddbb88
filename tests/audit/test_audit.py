"""The audit on stored synthetic rows: one claim of each verdict, and malformed claims files."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import datetime
from pathlib import Path

import pytest
from fixtures_reports import SyntheticExperiment

from db import Store
from db.measurements import Selection
from reports.audit import (
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    DeviceInfo,
    Environment,
    load_claims,
    parse_claims,
    run_audit,
    terminal_table,
    write_audit,
)
from reports.audit.report import audit_json
from reports.audit.verdict import decide
from reports.errors import ReportInputError

CLAIMS = """
source = "synthetic article"

[[claim]]
id = "k32-identical"
statement = "k = 32 generates exactly what exact attention generates"
metric = "identical_tokens"
expected = 1.0
tolerance = 0.0
experiment = "synthetic"
measure = { a = { policy = "exact" }, b = { policy = "sparse", k = 32 } }

[[claim]]
id = "k1-keeps-needle"
statement = "k = 1 still finds the needle"
metric = "recall"
expected = 1.0
tolerance = 0.1
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 1 }, baseline = { policy = "exact" } }

[[claim]]
id = "k1-faster"
statement = "k = 1 decodes 39 % faster than k = 32"
metric = "time_ratio"
expected = 0.61
tolerance = 0.1
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 32 }, b = { policy = "sparse", k = 1 } }
fair = { context = 2061 }

[[claim]]
id = "other-model"
statement = "decode takes 56.2 ms/token on Qwen3-VL-2B"
metric = "time_ratio"
expected = 56.2
tolerance = 5
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 1 }, b = { policy = "sparse", k = 1 } }
fair = { model = "Qwen3-VL-2B-Instruct", device_class = "rk3588" }

[[claim]]
id = "emulated-timing"
statement = "k = 1 is faster on the board"
metric = "time_ratio"
expected = 0.61
tolerance = 0.1
experiment = "synthetic"
[claim.measure]
a = { policy = "sparse", k = 32, device = "arm" }
b = { policy = "sparse", k = 1, device = "arm" }

[[claim]]
id = "k1-under-80pct"
statement = "k = 1 takes at most 80 % of the time of k = 32"
metric = "time_ratio"
at_most = 0.8
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 32 }, b = { policy = "sparse", k = 1 } }

[[claim]]
id = "k1-under-629pm"
statement = "k = 1 takes at most 62.9 % of the time of k = 32"
metric = "time_ratio"
at_most = 0.629
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 32 }, b = { policy = "sparse", k = 1 } }

[[claim]]
id = "k32-recalls"
kind = "sanity"
statement = "k = 32 recalls"
metric = "recall"
expected = 1.0
tolerance = 0.0
experiment = "synthetic"
measure = { a = { policy = "sparse", k = 32 } }
"""

ENV = Environment(models=("needle-tiny",), devices=(DeviceInfo("local", "x86", False),
                                                    DeviceInfo("arm", "rk3588", True)))


@pytest.fixture
def synthetic(tmp_path: Path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path}/audit.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm", arch="aarch64", cls="rk3588", emulated=True)
    for seed in range(3):
        for repeat in range(4):
            exp.run(policy="exact", ctx=2061, seed=seed, repeat=repeat, decode_ms=20.0 + repeat,
                    tokens=[1, 2, 3, 4])
            exp.run(policy="sparse", k=32, ctx=2061, seed=seed, repeat=repeat,
                    decode_ms=16.0 + repeat * 0.1, tokens=[1, 2, 3, 4])
            exp.run(policy="sparse", k=1, ctx=2061, seed=seed, repeat=repeat, recall=0.0,
                    decode_ms=10.0 + repeat * 0.1, tokens=[9, 9, 9, 9])
        for k, ms, recall in ((32, 50.0, 1.0), (1, 30.0, 0.0)):
            exp.run(device="arm", policy="sparse", k=k, ctx=2061, seed=seed, decode_ms=ms,
                    recall=recall)
    yield store
    store.close()


def claims_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "claims.toml"
    path.write_text(text)
    return path


def test_one_claim_of_each_verdict(synthetic: Store, tmp_path: Path) -> None:
    claims = load_claims(claims_file(tmp_path, CLAIMS))
    verdicts = {v.claim.id: v for v in run_audit(claims, synthetic, ENV)}

    identical = verdicts["k32-identical"]
    assert identical.verdict == REPRODUCED
    assert identical.measured == 1.0
    assert len(identical.runs) == 24  # 12 exact + 12 sparse k=32 runs on `local`

    lost = verdicts["k1-keeps-needle"]
    assert lost.verdict == NOT_REPRODUCED
    assert lost.measured == 0.0
    assert "baseline" in lost.reason

    faster = verdicts["k1-faster"]
    assert faster.verdict == REPRODUCED
    assert faster.measured == pytest.approx(10.15 / 16.15)  # medians of k=1 / k=32 on local

    other = verdicts["other-model"]
    assert other.verdict == NOT_COMPARABLE
    assert "Qwen3-VL-2B-Instruct" in other.reason and other.runs == []

    emulated = verdicts["emulated-timing"]
    assert emulated.verdict == NOT_COMPARABLE
    assert "emulated" in emulated.reason

    # a relation: its whole interval (the noise of runs paired by prompt and repeat) must clear
    # the bound; one within the noise of it is a tie, not a verdict
    bounded = verdicts["k1-under-80pct"]
    assert bounded.verdict == REPRODUCED and bounded.claim.expected_text() == "<= 0.8"
    assert bounded.kind == "relation" and 0 < bounded.noise < 0.01
    tie = verdicts["k1-under-629pm"]
    assert abs(tie.measured - 0.629) < tie.noise
    assert tie.verdict == INCONCLUSIVE and "straddles" in tie.reason
    # a timing varies run to run: its 12 pairs of runs (3 prompts x 4 repeats) are its units
    assert "more independent units (than the 12 measured) would decide it" in tie.reason

    # evidence on every verdict, named in its reason
    assert identical.kind == "direct" and identical.evidence is not None
    assert "3 distinct needle prompts of 2061 tokens" in identical.evidence.data
    assert "local (x86, not emulated" in identical.evidence.device
    assert identical.evidence.revision.startswith("lmc ")
    assert "evidence: " in identical.reason and identical.evidence.data in identical.reason

    # graded by what they show: a relation's bound met is its direction only, never a figure
    assert [identical.grade, lost.grade, faster.grade, bounded.grade, tie.grade] == [
        "reproduced", "not reproduced", "reproduced", "direction holds", "inconclusive"]
    assert verdicts["k32-recalls"].grade == "sanity holds"
    text = terminal_table(list(verdicts.values()))
    # the summary leads with the article's figures; a sanity check is never counted with them
    assert text.startswith("figures reproduced: 2 of 3 checkable; 2 reproduced; "
                           "1 not reproduced; 1 inconclusive; 1 direction holds; "
                           "1 sanity holds; 2 not comparable")
    # every claim's independent units: the 3 prompts, never their 4 deterministic repeats
    assert (identical.units.count, identical.units.what) == (3, "3 needle prompts (seeds 0, 1, 2)")

    out = write_audit(tmp_path / "out", "audit", list(verdicts.values()))
    markdown = out.read_text()
    assert "k1-keeps-needle: not reproduced (direct)" in markdown
    assert markdown.splitlines()[4].startswith("| claim | article's figure | article's setting |")
    # rows by grade: the checkable figures first, the not comparable last
    rows = [line.split("|")[1].strip() for line in markdown.splitlines()[6:14]]
    assert rows[:2] == ["k32-identical", "k1-faster"] and rows[-2:] == ["other-model",
                                                                        "emulated-timing"]
    html = (tmp_path / "out" / "audit.html").read_text()
    assert html.count("<details><summary>") == 8 and "<dt>reason</dt>" in html
    stored = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert [v["verdict"] for v in stored] == [REPRODUCED, NOT_REPRODUCED, REPRODUCED,
                                             NOT_COMPARABLE, NOT_COMPARABLE, REPRODUCED,
                                             INCONCLUSIVE, REPRODUCED]
    assert [v["grade"] for v in stored][:3] == ["reproduced", "not reproduced", "reproduced"]
    for record in stored:
        assert {"claim", "verdict", "grade", "units", "precondition", "kind", "measured",
                "expected", "evidence", "reason"} <= set(record)
        assert {"model", "device", "data", "revision", "runs"} <= set(record["evidence"])


def test_all_measurements_and_time_windows_choose_the_evidence(tmp_path: Path) -> None:
    """By default a claim rests on each run's latest ok measurement; --all-measurements takes
    every ok one (a rerun with --force adds one), --until the ones before a moment."""
    store = Store.open(f"sqlite:///{tmp_path}/m.db")
    exp = SyntheticExperiment(store)
    for seed in range(2):
        exp.run(policy="sparse", k=32, ctx=2061, seed=seed, decode_ms=20.0)
        exp.run(policy="sparse", k=1, ctx=2061, seed=seed, decode_ms=10.0)
        exp.count -= 1  # the same run key again: a second measurement of that k = 1 run
        exp.run(policy="sparse", k=1, ctx=2061, seed=seed, decode_ms=16.0)
    claim = CLAIMS.split("[[claim]]")[0] + "[[claim]]" + CLAIMS.split("[[claim]]")[3]
    claims = parse_claims(claim, tmp_path / "c.toml")
    (latest,) = run_audit(claims, store, ENV)
    (every,) = run_audit(claims, store, ENV, selection=Selection(all_measurements=True))
    (before,) = run_audit(claims, store, ENV, selection=Selection(
        all_measurements=True, until=datetime(2000, 1, 1)))
    store.close()
    assert latest.claim.id == "k1-faster" and latest.measured == pytest.approx(16.0 / 20.0)
    assert len(latest.runs) == 4 and every.runs == latest.runs
    # a second measurement of a run is not another independent unit: each run counts once,
    # by its latest ok measurement, whichever measurements are selected
    assert every.measured == latest.measured and every.units.count == 2
    assert before.measured is None and before.verdict == NOT_COMPARABLE


def table(index: int, claim_id: str, extra: str) -> str:
    """CLAIMS' claim ``index`` (1 = the first) as ``claim_id``, with ``extra`` keys after its id."""
    body = CLAIMS.split("[[claim]]")[index]
    old = body.split("\n")[1]  # its id line
    return "[[claim]]" + body.replace(old, f'id = "{claim_id}"\n{extra}'.rstrip("\n"), 1)


# a rule with and without a mutant (k32-identical's check), the article's own arithmetic, and a
# figure whose mechanism needs what the runs lack (k1-faster's check, needing k = 1 to recall)
GRADED = (CLAIMS.split("[[claim]]")[0]
          + table(1, "rule-without-mutant", 'kind = "verified"')
          + table(1, "rule-with-mutant", 'kind = "verified"\nmutant = "budget"')
          + """[[claim]]
id = "own-arithmetic"
statement = "0.491 / 0.102 is 4.8"
metric = "quotient"
expected = 4.8
tolerance = 0.05
measure = { params = { numerator = 0.491, denominator = 0.102 } }

"""
          + table(3, "needs-recall-at-k1", "").rstrip("\n") + """
[claim.precondition]
what = "recall at k = 1"
metric = "recall"
measure = { a = { policy = "sparse", k = 1 } }
at_least = 0.5
""")


def test_inconclusive_says_how_many_more_units_would_decide(tmp_path: Path) -> None:
    text = CLAIMS.split("[[claim]]")[0] + "[[claim]]" + CLAIMS.split("[[claim]]")[3]
    claim = parse_claims(text.replace("tolerance = 0.1", "tolerance = 0.001"),
                         tmp_path / "c.toml").claims[0]
    # a figure matched, but our noise (0.01 over 3 prompts) is ten times the claim's tolerance:
    # 3 x 10^2 = 300 prompts would bring it under, 297 more
    verdict, why = decide(claim, 0.61, 0.01, units=3)
    assert verdict == INCONCLUSIVE and "about 297 more independent units" in why
    # the same noise and the whole interval off the range: a miss, whatever the units
    assert decide(claim, 0.70, 0.01, units=3)[0] == NOT_REPRODUCED
    # within the tolerance widened by a noise no wider than it: reproduced
    assert decide(claim, 0.6115, 0.0008, units=3)[0] == REPRODUCED


def test_grades_say_what_a_pass_shows(synthetic: Store, tmp_path: Path) -> None:
    claims = load_claims(claims_file(tmp_path, GRADED))
    verdicts = {v.claim.id: v for v in run_audit(claims, synthetic, ENV)}
    # a rule's check passes both times; only the one with a mutant that flips it is verified
    assert [verdicts[n].verdict for n in ("rule-without-mutant", "rule-with-mutant")] == [
        REPRODUCED, REPRODUCED]
    assert verdicts["rule-without-mutant"].grade == "holds, check unproven"
    assert verdicts["rule-with-mutant"].grade == "verified"
    assert verdicts["own-arithmetic"].grade == "consistent"
    # the mechanism's precondition is measured: absent, whatever the claim's own check says
    absent = verdicts["needs-recall-at-k1"]
    assert absent.grade == "precondition absent" and absent.precondition_absent
    assert absent.reason.startswith("precondition absent: recall at k = 1 is 0")
    record = json.loads(audit_json([absent]))[0]
    measured = record["precondition"]["measured"]
    assert record["precondition"]["absent"] and measured.startswith("recall at k = 1: 0 ")
    assert "(needs >= 0.5;" in measured
    assert terminal_table(list(verdicts.values())).startswith(
        "figures reproduced: 0 of 0 checkable; 1 consistent; 1 verified; "
        "1 holds, check unproven; 1 precondition absent")


def test_failing_baseline_makes_recall_not_comparable(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/b.db")
    exp = SyntheticExperiment(store)
    exp.run(policy="exact", recall=0.0)
    exp.run(policy="sparse", k=1, recall=0.0)
    text = CLAIMS.split("[[claim]]")[0] + "[[claim]]" + CLAIMS.split("[[claim]]")[2]
    verdict, = run_audit(parse_claims(text, tmp_path / "c.toml"), store, ENV)
    assert verdict.verdict == NOT_COMPARABLE
    assert "baseline itself recalls only 0" in verdict.reason
    store.close()


@pytest.mark.parametrize("edit, message", [
    (("metric = \"recall\"", "metric = \"speed\""),
     "claim 'k1-keeps-needle': key 'metric': unknown metric 'speed'"),
    (("tolerance = 0.1\nexperiment = \"synthetic\"\nmeasure = { a = { policy = \"sparse\", k = 1 }",
      "experiment = \"synthetic\"\nmeasure = { a = { policy = \"sparse\", k = 1 }"),
     "claim 'k1-keeps-needle': key 'tolerance': required"),
    (("expected = 0.61\ntolerance = 0.1\nexperiment = \"synthetic\"\nmeasure = { a = { "
      "policy = \"sparse\", k = 32 }, b",
      "expected = \"fast\"\ntolerance = 0.1\nexperiment = \"synthetic\"\nmeasure = { a = { "
      "policy = \"sparse\", k = 32 }, b"),
     "claim 'k1-faster': key 'expected': must be a number, got 'fast'"),
    (("fair = { context = 2061 }", "fair = { context = 2061, gpu = true }"),
     "claim 'k1-faster': key 'fair.gpu': unknown key"),
    (("measure = { a = { policy = \"exact\" }, b",
      "measure = { a = { policy = \"exact\", color = 1 }, b"),
     "claim 'k32-identical': key 'measure.a.color': unknown key"),
    (("at_most = 0.8", "at_most = 0.8\nexpected = 0.5"),
     "claim 'k1-under-80pct': key 'at_most': give either expected"),
    (("id = \"k1-faster\"", "id = \"k32-identical\""),
     "claim 'k32-identical': key 'id': is used by two claims"),
])
def test_malformed_claims_name_file_claim_and_key(tmp_path: Path, edit: tuple[str, str],
                                                  message: str) -> None:
    old, new = edit
    assert old in CLAIMS
    path = claims_file(tmp_path, CLAIMS.replace(old, new, 1))
    with pytest.raises(ReportInputError) as info:
        load_claims(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)
    assert ReportInputError.exit_code == 2


def test_claim_without_id_is_named_by_position(tmp_path: Path) -> None:
    path = claims_file(tmp_path, 'source = "x"\n[[claim]]\nstatement = "s"\nmetric = "recall"\n')
    with pytest.raises(ReportInputError, match=r"claim #1: key 'id': required"):
        load_claims(path)


ATTN_CLAIMS = """
source = "test"

[experiment.audit-test-attn]
repeats = 2
warmups = 0
[experiment.audit-test-attn.engine.policy.exact]
[experiment.audit-test-attn.engine.policy.sparse]
k = 4
[[experiment.audit-test-attn.workload]]
kind = "attn-bench"
ctx = 1024
heads = 4
kv_heads = 2
head_dim = 64
runs = 3

[[claim]]
id = "sparse-faster"
kind = "direct"
statement = "sparse k = 4 attention takes less than exact at 1024 tokens"
metric = "time_ratio"
at_most = 1.0
experiment = "audit-test-attn"
measure = { a = { policy = "exact" }, b = { policy = "sparse", k = 4 }, field = "attn_median_ms" }

[[claim]]
id = "other-model"
statement = "a number from a model we cannot run"
metric = "reported"
quantity = "something"
fair = { model = "MiniCPM5-2B" }
"""


def db_rows(path: Path) -> list[str]:
    """Every row of every table of a SQLite file, as SQL text (read-only)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return list(db.iterdump())


def test_cli_audit_runs_what_is_missing(tmp_path: Path, ray_address: str,
                                        capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import main

    path = claims_file(tmp_path, ATTN_CLAIMS)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    argv = ["--db", f"sqlite:///{tmp_path}/cli.db", "audit", str(path), "--inventory",
            str(inventory), "--ray-address", ray_address, "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "4 runs in the matrix, 0 already done, 4 ok" in first
    assert "other-model" in first and "MiniCPM5-2B" in first
    verdicts = json.loads((tmp_path / "out" / "audit.json").read_text())
    timed = verdicts[0]
    # a one-sided figure: no noise is wider than its range, so it is never inconclusive
    assert timed["verdict"] in ("reproduced", "not reproduced") and timed["measured"] > 0
    assert len(timed["evidence"]["runs"]) == 4
    assert verdicts[1]["verdict"] == "not comparable"

    assert main(argv) == 0  # stored runs are reused: nothing runs twice
    assert "4 already done, 0 ok" in capsys.readouterr().out
    # --stored-only runs, builds and stores nothing, and finds the same evidence: its run keys
    # come from the engine's identity, not from a build (none may appear in an empty build dir)
    rows = db_rows(tmp_path / "cli.db")
    monkeypatch.setenv("BENCHFARM_BUILD_DIR", str(tmp_path / "no-builds"))
    assert main([*argv, "--stored-only", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # --json: stdout is the verdicts, nothing else
    assert [r["claim"] for r in printed] == ["sparse-faster", "other-model"]
    assert printed[0]["kind"] == "direct" and printed[0]["measured"] == timed["measured"]
    evidence = printed[0]["evidence"]
    assert evidence["model"] == "no model: synthetic q/k/v (attn-bench)"
    assert "1 distinct synthetic uniform q/k/v (seed 0), 4 heads / 2 KV heads / dim 64, " \
        "1024 positions" in evidence["data"] and evidence["revision"].startswith("lmc ")
    assert evidence["runs"] == timed["evidence"]["runs"]
    assert db_rows(tmp_path / "cli.db") == rows
    # and so does a report with the claims' audit as a section (judged on the stored runs)
    assert main(["--db", f"sqlite:///{tmp_path}/cli.db", "report", "audit-test-attn",
                 "--claims", str(path), "--inventory", str(inventory),
                 "--out", str(tmp_path / "report")]) == 0
    assert "sparse-faster" in (tmp_path / "report" / "audit.md").read_text()
    assert db_rows(tmp_path / "cli.db") == rows
    assert not (tmp_path / "no-builds").exists()
    monkeypatch.delenv("BENCHFARM_BUILD_DIR")
    again = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert again[0]["evidence"]["runs"] == timed["evidence"]["runs"]
    assert again[0]["measured"] == timed["measured"]

    broken = claims_file(tmp_path, ATTN_CLAIMS.replace("ctx = 1024", "ctx = 0"))
    assert main(["--db", f"sqlite:///{tmp_path}/cli.db", "audit", str(broken)]) == 2
    error = capsys.readouterr().err
    assert "claims.toml#experiment.audit-test-attn" in error and "ctx" in error
