"""`benchfarm run` without --ray-address on a machine where a Ray cluster was started
(`ray start --head`, its address in $RAY_ADDRESS): the run starts a private instance of its own
instead of joining it (which used to fail with "When connecting to an existing cluster,
num_cpus and num_gpus must not be provided")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fixtures_cluster import TwoNodeCluster
from fixtures_ray import needle_spec


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
            cwd=tmp_path, env=head.env(RAY_ADDRESS=head.address), capture_output=True,
            text=True, timeout=300)
    finally:
        head.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "2 ok" in proc.stdout, proc.stdout
