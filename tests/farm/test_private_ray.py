"""`benchfarm run` without --ray-address on a machine where a Ray cluster was started
(`ray start --head`, its address in $RAY_ADDRESS): the run starts a private instance of its own
instead of joining it (which used to fail with "When connecting to an existing cluster,
num_cpus and num_gpus must not be provided")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fixtures_cluster import TwoNodeCluster
from fixtures_ray import needle_spec

from harness.execution.ray_log import KEEP_LOGS

REPO = Path(__file__).resolve().parents[2]


def test_run_starts_a_private_instance_beside_a_started_cluster(
        needle_model: Path, tmp_path: Path) -> None:
    head = TwoNodeCluster(tmp_path, [])
    head.start_head()  # its own --temp-dir and port; stopped by its process group below
    try:
        inventory = tmp_path / "local.toml"
        inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
        spec = needle_spec(tmp_path, "beside-a-cluster", needle_model, ["local"])
        proc = subprocess.run(
            [sys.executable, "-m", "harness.cli", "--db", f"sqlite:///{tmp_path}/own.db", "run",
             str(spec), "--inventory", str(inventory)],
            cwd=tmp_path, env=head.env(RAY_ADDRESS=head.address,
                                       BENCHFARM_RAY_LOG=str(tmp_path / "ray.log"),
                                       PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True, timeout=300)
    finally:
        head.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "2 ok" in proc.stdout, proc.stdout
    # Ray's own messages are in its log file, named in one line, not on the terminal
    assert f"benchfarm: Ray's own messages are in {tmp_path / 'ray.log'}" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert "Started a local Ray instance" in (tmp_path / "ray.log").read_text()


# A driver that waits for a message Ray publishes to every driver (as the GCS does when a node
# dies, with the raylet's log tail) to reach its log file. The driver's listener subscribes in
# a thread of its own after ray.init returns, and a message published before it subscribed is
# never delivered (a loaded CI machine lost the only one), so the message is published again
# every two seconds until it arrives. Without RAY_AUTH_MODE, Ray also warns that it enabled
# token authentication.
PUBLISHED = """
import sys, time
import ray
from ray._private.utils import publish_error_to_driver
from harness.execution.cluster import ray_session
log = sys.argv[1]
with ray_session(None):
    deadline = time.monotonic() + 240
    while "a node died" not in open(log).read() and time.monotonic() < deadline:
        publish_error_to_driver("node_died", "a node died: its raylet said 50 lines",
                                ray._private.worker.global_worker.gcs_client)
        time.sleep(2)
print("done")
"""


def test_messages_ray_publishes_to_the_driver_go_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "ray.log"
    proc = subprocess.run([sys.executable, "-c", PUBLISHED, str(log)], cwd=tmp_path,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("RAY_AUTH")},
                               "BENCHFARM_RAY_LOG": str(log), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "done\n" and "a node died" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and str(log) in proc.stderr, proc.stderr
    written = log.read_text()
    assert "(raylet) a node died: its raylet said 50 lines" in written
    assert "Token authentication is enabled" in written


def test_the_state_folder_keeps_the_newest_ray_logs(tmp_path: Path) -> None:
    folder = tmp_path / "benchfarm"
    folder.mkdir()
    old = [folder / f"ray-20260101-{i:06d}-1.log" for i in range(KEEP_LOGS + 10)]
    for path in old:
        path.write_text("old\n")
    env = {k: v for k, v in os.environ.items() if k != "BENCHFARM_RAY_LOG"}
    proc = subprocess.run(
        [sys.executable, "-c", "from harness.execution.ray_log import "
         "keep_ray_off_the_terminal as k; print(k())"],
        env=env | {"XDG_STATE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new = Path(proc.stdout.strip())
    assert new.parent == folder and new.is_file()
    assert sorted(folder.glob("ray-*.log")) == sorted([*old[10:], new])
