"""Jobs that cannot be read, and coordinators that die. A model folder whose config.json nests
200,000 deep is refused by `submit` and by `run --dry-run` (one line, exit 2); written straight
into the queue, it fails once in `serve` with its reason, never retried, and `serve` goes on
to the next job. A predictor over 64 MiB is refused with the spec. A `benchfarm run` killed
with SIGKILL leaves its job running: `wait` ends it as lost once its heartbeat lapses. The
real CLI, real processes, the real store."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from fixtures_ray import needle_spec, start_cli
from test_hostile_input import cli

from db.store import Store

DEEP = 200_000


def poisoned_model(folder: Path, model: Path) -> Path:
    poisoned = folder / "poisoned-model"
    shutil.copytree(model, poisoned)
    (poisoned / "config.json").write_text("[" * DEEP + "]" * DEEP)
    return poisoned


def local_inventory(tmp_path: Path) -> Path:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    return inventory


def test_a_config_nested_200000_deep_is_refused_by_submit_and_dry_run(
        tmp_path: Path, needle_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = needle_spec(tmp_path, "poison", poisoned_model(tmp_path, needle_model), ["local"])
    db = ["--db", f"sqlite:///{tmp_path}/poison.db"]
    Store.open(db[1]).close()  # a store: the dry run names the runs it holds already
    inv = ["--inventory", str(local_inventory(tmp_path))]
    code, err = cli(capsys, *db, "run", str(spec), *inv, "--dry-run")
    assert code == 2 and "config.json" in err and "nested" in err, err
    code, err = cli(capsys, *db, "submit", str(spec), *inv)
    assert code == 2 and "config.json" in err and "nested" in err, err
    with Store.open(db[1]) as store:
        assert store.jobs.list() == []


def test_serve_fails_a_poison_job_once_and_goes_on(ray_address: str, tmp_path: Path,
                                                   needle_model: Path) -> None:
    url = f"sqlite:///{tmp_path}/queue.db"
    poison = needle_spec(tmp_path, "poison", poisoned_model(tmp_path, needle_model), ["local"])
    other = needle_spec(tmp_path, "other", needle_model, ["nosuch"])
    with Store.open(url) as store:  # written straight into the queue, as a shared store allows
        for spec in (poison, other):
            store.jobs.add(spec.stem, str(spec), spec.read_text(), owner="someone")
    argv = ["--db", url, "serve", "--ray-address", ray_address, "--until-idle",
            "--no-health-checks", "--inventory", str(local_inventory(tmp_path))]
    serve = start_cli(argv, tmp_path)
    out, err = serve.communicate(timeout=300)
    assert serve.returncode == 0, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    with Store.open(url) as store:
        first, second = store.jobs.get(1), store.jobs.get(2)
    assert first.state == "failed" and "config.json" in first.message, first.message
    assert second.state == "failed" and "nosuch" in second.message  # it went on
    again = start_cli(argv, tmp_path)  # failed once: no serve takes it again
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and "queue empty" in out, out + err
    with Store.open(url) as store:
        assert store.jobs.get(1) == first


def test_a_predictor_over_64_mib_is_refused_with_the_spec(
        tmp_path: Path, needle_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    predictor = tmp_path / "big.gbm"
    with predictor.open("wb") as handle:  # sparse: 65 MiB that take no disk
        handle.write(b"lmc-gbm 1\n")
        handle.truncate(65 << 20)
    spec = needle_spec(tmp_path, "big-predictor", needle_model, ["local"],
                       extra='[engine.policy.gbm]\npredictor = "big.gbm"\n')
    code, err = cli(capsys, "--db", f"sqlite:///{tmp_path}/p.db", "run", str(spec),
                    "--inventory", str(local_inventory(tmp_path)), "--dry-run")
    assert code == 2 and "predictor" in err and "larger than 64 MiB" in err, err


def test_wait_ends_the_job_of_a_run_killed_outright(ray_address: str, tmp_path: Path,
                                                    needle_model: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/killed.db"
    spec = needle_spec(tmp_path, "killed", needle_model, ["local"])
    run = start_cli(["--db", url, "run", str(spec), "--inventory",
                     str(local_inventory(tmp_path)), "--lease-ttl", "3", "--ray-address",
                     ray_address], tmp_path)
    deadline = time.monotonic() + 120
    try:
        while True:  # its job is recorded running, then the coordinator is killed outright
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            if Path(f"{tmp_path}/killed.db").exists():
                with Store.open(url) as store:
                    if [j for j in store.jobs.list() if j.state == "running"]:
                        break
            time.sleep(0.1)
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.communicate()
    monkeypatch.setenv("BENCHFARM_LEASE_TTL_S", "3")
    waiting = start_cli(["--db", url, "wait", "1", "--poll", "0.2"], tmp_path)
    try:
        out, err = waiting.communicate(timeout=90)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 1, out + err
    assert "job 1 failed: lost:" in out and "stopped heartbeating" in out
