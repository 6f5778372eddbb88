"""Published llama-bench rows as claims: the [[llama_bench]] parser, the "not comparable"
verdicts, and (with llama.cpp built) one row audited end to end on the farm's x86 node."""

from __future__ import annotations

import json
import sqlite3
import statistics
import zlib
from contextlib import closing
from pathlib import Path

import pytest

from reports.audit import (
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    DeviceInfo,
    Environment,
    load_claims,
    parse_claims,
    run_audit,
)
from reports.errors import ReportInputError

REPO = Path(__file__).resolve().parents[2]
ROW = """
source = "a table"
[[llama_bench]]
id = "{id}"
model = "{model}"
quant = "{quant}"
test = "{test}"
tps = {tps}
sd = 0.5
board = "{board}"
threads = 1
build = "b1 (abc)"
"""


def row(id: str = "r1", model: str = "needle-tiny", quant: str = "F32", test: str = "tg16",
        tps: float = 100.0, board: str = "x86") -> str:
    return ROW.format(id=id, model=model, quant=quant, test=test, tps=tps, board=board)


def test_a_row_becomes_a_claim_with_the_experiment_that_runs_its_test() -> None:
    claims = parse_claims(row(test="pp64", quant="Q8_0", tps=50) + row(id="r2", test="tg32"),
                          Path("rows.toml"))
    pp, tg = claims.claims
    assert (pp.metric, pp.expected, pp.unit, pp.measure.field) == ("llama_bench_tps", 50.0,
                                                                    "t/s", "pp64")
    # default: the published spread, ± 2 sd (sd 0.5), not a band picked by hand
    assert pp.within(50.99) and not pp.within(51.01) and pp.tolerance_text() == "± 1"
    assert (pp.fair.models, pp.fair.device_class, pp.fair.allow_emulated) == (
        ("needle-tiny",), "x86", False)
    fragment = claims.experiments[pp.experiment]
    assert fragment["engines"] == ["llama-bench"]
    assert fragment["llama-bench"]["gguf_type"] == ["q8_0"]
    assert fragment["llama-bench"]["threads"] == [1]
    assert fragment["workload"][0]["ctx"] == 64  # pp64: a prompt of 64 tokens
    assert claims.experiments[tg.experiment]["workload"][0]["max_new"] == 32


def test_the_shipped_rk3588_rows_parse_and_cite_their_source() -> None:
    claims = load_claims(REPO / "claims" / "llamacpp_rk3588.toml").claims
    assert len(claims) >= 3 and len({c.id for c in claims}) == len(claims)
    for claim in claims:
        assert claim.source.startswith("https://") and claim.fair.device_class == "rk3588"
        assert f"{claim.expected:g}" in claim.statement


@pytest.mark.parametrize(("edit", "key", "message"), [
    (("test = \"tg16\"", "test = \"tg 16\""), "test", "expected ppN or tgN"),
    (("threads = 1", "threads = 0"), "threads", "whole number >= 1"),
    (("tps = 100.0", "tps = \"fast\""), "tps", "must be a number"),
    (("build = \"b1 (abc)\"\n", ""), "build", "required"),
    (("board = \"x86\"", "board = \"x86\"\ncolour = 1"), "colour", "unknown key"),
])
def test_a_bad_row_names_the_file_the_row_and_the_key(edit: tuple[str, str], key: str,
                                                      message: str) -> None:
    text = row().replace(*edit)
    with pytest.raises(ReportInputError, match=rf"rows.toml: llama_bench 'r1': key '{key}': "
                                               rf".*{message}"):
        parse_claims(text, Path("rows.toml"))
    with pytest.raises(ReportInputError, match="key 'id': is used by two rows"):
        parse_claims(row() + row(), Path("rows.toml"))


def test_the_cli_exits_2_naming_the_claims_file_and_key(tmp_path: Path, capsys) -> None:
    from harness.cli import main

    path = tmp_path / "rows.toml"
    path.write_text(row(test="pp"))
    assert main(["--db", f"sqlite:///{tmp_path}/x.db", "audit", str(path)]) == 2
    assert f"{path}: llama_bench 'r1': key 'test'" in capsys.readouterr().err


def test_rows_that_cannot_be_run_here_are_not_comparable_and_say_why() -> None:
    npu = row(id="npu").replace("threads = 1", "threads = 1\nbackend = \"RKNPU\"")
    text = (row(id="other-model", model="gemma4 E2B") + row(id="emulated-board", board="rk3588")
            + row(id="q4", quant="Q4_0") + npu)
    claims = parse_claims(text, Path("rows.toml"))
    env = Environment(models=("needle-tiny",),
                      devices=(DeviceInfo("farm-x86", "x86", False),
                               DeviceInfo("farm-arm", "rk3588", True)))
    verdicts = {v.claim.id: v for v in run_audit(claims, None, env)}  # nothing runs, no store
    assert all(v.verdict == NOT_COMPARABLE for v in verdicts.values())
    assert "gemma4 E2B, which benchfarm cannot run here" in verdicts["other-model"].reason
    assert "no usable device of that class here (devices: farm-x86 (x86), farm-arm " \
           "(rk3588, emulated))" in verdicts["emulated-board"].reason
    assert "Q4_0 weights" in verdicts["q4"].reason
    assert "RKNPU backend" in verdicts["npu"].reason
    assert set(claims.experiments) == {"llama-bench-other-model", "llama-bench-emulated-board"}


def stored_llama_tests(db: Path) -> list[dict]:
    """llama-bench's own JSON rows of every stored run, read straight from the SQLite file (the
    store keeps each document zlib-compressed: db/packing.py)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        docs = [r[0] for r in conn.execute(
            "SELECT m.raw_json FROM measurements m JOIN runs r ON r.id = m.run_id "
            "WHERE r.engine = 'llama-bench' AND m.status = 'ok'")]
    return [test for doc in docs for test in json.loads(zlib.decompress(doc))]


@pytest.mark.slow
def test_a_row_is_audited_by_running_its_test_on_the_x86_node(
        farm, llama_bench: Path, ray_address: str, tmp_path: Path, capsys) -> None:
    from harness.cli import main

    claims = tmp_path / "rows.toml"
    claims.write_text(row(test="tg8", tps=1e9))  # no CPU decodes a token per nanosecond
    db = tmp_path / "rows.db"
    argv = ["--db", f"sqlite:///{db}", "audit", str(claims), "--inventory",
            str(farm.inventory_path), "--devices", "farm-x86", "--ray-address", ray_address,
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert "1 runs in the matrix, 0 already done, 1 ok" in capsys.readouterr().out
    verdict = json.loads((tmp_path / "out" / "audit.json").read_text())[0]
    assert verdict["verdict"] == NOT_REPRODUCED and "below the claimed" in verdict["reason"]
    # the measured t/s is llama-bench's own figure for that test, from the stored raw output
    tg = [t for t in stored_llama_tests(db) if (t["n_prompt"], t["n_gen"]) == (0, 8)]
    assert len(tg) == 1 and tg[0]["n_threads"] == 1 and len(tg[0]["samples_ns"]) == 5
    assert verdict["measured"] == pytest.approx(statistics.fmean(tg[0]["samples_ts"]),
                                                rel=1e-3)
    assert verdict["measured"] == pytest.approx(tg[0]["avg_ts"], rel=1e-3)

    # judged again on the stored runs only: the same verdict, and the store as it was
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = list(conn.iterdump())
    assert main([*argv, "--stored-only"]) == 0
    assert "runs in the matrix" not in capsys.readouterr().out
    again = json.loads((tmp_path / "out" / "audit.json").read_text())[0]
    assert (again["verdict"], again["measured"], again["evidence"]) == (
        verdict["verdict"], verdict["measured"], verdict["evidence"])
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert list(conn.iterdump()) == rows
