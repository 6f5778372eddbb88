"""A served job that pins an instruction-set level its board lacks (devices.isa): `submit`
refuses it when its inventory already says so (exit 2); one queued while the board could run
it (the board was swapped for a Cortex-A72 since, or the serve's inventory pins the level)
fails once, naming the board and the missing features, and the queue goes on: the next job
runs. Real CLI, real store, the real farm's emulated Cortex-A72 node, real Ray and engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_farm import Farm
from fixtures_ray import cli_here, needle_spec

from db.store import Store
from devices.isa import BY_NAME, QEMU_MODELS

DOTPROD = "armv8.2-a+dotprod"
LACKING = sorted(BY_NAME[DOTPROD].features - QEMU_MODELS["cortex-a72"])  # asimddp, asimdhp


def test_a_served_job_pinning_a_level_its_board_lacks_fails_once_and_the_queue_goes_on(
        farm: Farm, ray_address: str, needle_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/isa.db"
    local = f'\n[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n'
    real = farm.inventory_path.read_text() + local
    assert '"cortex-a72"' in real and LACKING
    # what the submitter's inventory said: farm-a72 was an A76 board (before it was swapped)
    before = tmp_path / "before.toml"
    before.write_text(real.replace('"cortex-a72"', '"cortex-a76"'))
    # the serve's: the board as it is now, and an operator's pin of its level
    now = tmp_path / "now.toml"
    now.write_text(real.replace('name = "farm-a72"\n',
                                f'name = "farm-a72"\nisa = "{DOTPROD}"\n'))
    assert now.read_text() != real  # the pin went in
    pinned = needle_spec(tmp_path, "isa-pinned", needle_model, ["farm-a72"],
                         extra=f'isa = ["{DOTPROD}"]')
    plain = needle_spec(tmp_path, "isa-plain", needle_model, ["farm-a72"])
    good = needle_spec(tmp_path, "isa-good", needle_model, ["local"])
    db = ["--db", url]

    refused = cli_here(capsys, *db, "submit", str(pinned), "--inventory", str(farm.inventory_path))
    assert refused.returncode == 2, refused.stdout
    assert "'farm-a72'" in refused.stderr and all(f in refused.stderr for f in LACKING)
    for spec in (pinned, plain, good):  # jobs 1, 2, 3
        done = cli_here(capsys, *db, "submit", str(spec), "--inventory", str(before))
        assert done.returncode == 0, done.stderr

    served = subprocess.run([sys.executable, "-m", "harness.cli", *db, "serve", "--ray-address",
                             ray_address, "--inventory", str(now), "--until-idle",
                             "--no-health-checks", "--poll", "0.2"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert served.returncode == 0, served.stderr[-3000:]
    with Store.open(url) as store:
        jobs = [store.jobs.get(n) for n in (1, 2, 3)]
        stories = [[e.event for e in store.jobs.events(n)] for n in (1, 2, 3)]
        attempts = [store.jobs.attempts(n) for n in (1, 2, 3)]
    assert [job.state for job in jobs] == ["failed", "failed", "done"], served.stdout
    for job in jobs[:2]:
        assert job.message and "board 'farm-a72'" in job.message, job.message
        assert all(feature in job.message for feature in LACKING), job.message
    assert "key 'isa'" in jobs[0].message  # the spec's pin
    assert "the inventory's isa for 'farm-a72'" in jobs[1].message
    # once: claimed, failed, never requeued or retried; no run of theirs was started
    assert stories[0] == stories[1] == ["submitted", "claimed", "finished"], stories
    assert attempts[0] == attempts[1] == []
    assert attempts[2] and {a.status for a in attempts[2]} == {"ok"}
    assert "job 1 (isa-pinned) failed: " in served.stdout
    assert "queue empty; stopping (--until-idle)" in served.stdout
