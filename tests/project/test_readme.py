"""The README's command blocks marked `<!-- tested: NAME -->` run as written, in a scratch
folder, with `benchfarm` on the PATH: the quick start on a local farm of its own, then the
team section's steps and the lab section's in one store."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

from devices import procs

REPO = Path(__file__).resolve().parents[2]


def block(name: str) -> str:
    """The indented command block after the README's `<!-- tested: NAME -->`."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(f"<!-- tested: {name} -->") + 1
    commands: list[str] = []
    for line in lines[start:]:
        if line.startswith("    "):
            commands.append(line[4:])
        elif line.strip() and commands:
            break
    assert commands, f"no commands after the {name} marker"
    return "\n".join(commands)


def scratch(folder: Path) -> dict[str, str]:
    """A folder with the checkout's specs and models, and the environment of a user who
    installed benchfarm: the command on the PATH, no store or inventory set."""
    folder.mkdir()
    for name in ("specs", "models"):
        (folder / name).symlink_to(REPO / name)
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "benchfarm"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m harness.cli "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("BENCHFARM_DB", "BENCHFARM_INVENTORY", "RAY_ADDRESS")}
    return env | {"PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(REPO)}


def run_block(name: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block(name)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"README block {name!r}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_quick_start_runs_as_written(engine_build, engine_build_aarch64,
                                     tmp_path: Path) -> None:
    folder = tmp_path / "quick"
    env = scratch(folder)
    try:
        out = run_block("quick start", folder, env)
    finally:
        subprocess.run(["benchfarm", "farm", "down"], cwd=folder, env=env, capture_output=True)
    assert "job 1: experiment farm-quickstart: 20 runs in the matrix" in out
    assert (folder / "out" / "reports" / "farm-quickstart" / "index.html").is_file()
    # status's table: command policy k device revision runs decode attn overhead recall ppl;
    # exact attention finds the needle on both nodes, and nothing warns that it failed
    exact = [line.split() for line in out.splitlines() if line.startswith("generate  exact")]
    assert sorted((row[3], row[9]) for row in exact) == [("farm-arm", "1.00"),
                                                         ("farm-x86", "1.00")]
    assert "WARNING" not in out
    assert "farm-x86" in out.split("report:")[-1]  # the comparison names both nodes


def test_team_and_lab_sections_run_as_written(engine_build, tmp_path: Path) -> None:
    folder = tmp_path / "team"
    env = scratch(folder)
    out = run_block("team", folder, env)
    assert "queued job 1: experiment farm-quickstart" in out and "job 1 done" in out
    # `logs 1` tells its story in order: submitted, claimed by the serve, its runs, finished
    story = out[out.index("job 1: experiment farm-quickstart, owner"):].splitlines()
    whats = [line.split()[1] for line in story[1:] if line.startswith("  20")]
    assert whats[:2] == ["submitted", "claimed"] and whats[-1] == "finished", story
    assert whats.count("run") == 20  # its 10 runs on local: each started and ended
    out = run_block("lab", folder, env)
    assert "local: maintenance (new fan)" in out and "reserved by" in out
    assert "cancelled job 2 (farm-quickstart" in out and "total: would free" in out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@ray.remote
def answer(question: int) -> int:
    return question + 1


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # the fields after the name: state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


def test_a_ray_cluster_started_for_benchfarm_stops_alone(ray_address: str,
                                                         tmp_path: Path) -> None:
    """The README's start and stop of a head node, beside the session's own Ray instance:
    the head's processes are all gone afterwards, the other Ray still answers."""
    folder = tmp_path / "cluster"
    env = scratch(folder)
    (folder / ".venv").symlink_to(sys.prefix)
    ray_dir = tempfile.mkdtemp(prefix="bf-ray-")  # Ray's socket paths must stay short
    env |= {"GCS_PORT": str(free_port()), "CLIENT_PORT": str(free_port()),
            "AGENT_PORT": str(free_port()), "RAY_DIR": ray_dir}
    pgid = None
    try:
        run_block("ray cluster", folder, env)
        pgid = int((folder / "ray-head.pgid").read_text())
        deadline = time.monotonic() + 60  # SIGTERMed processes take a moment to exit
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_members(pgid) == [], (folder / "ray-head.log").read_text()[-3000:]
        assert ray.get(answer.remote(41)) == 42  # the other Ray still runs tasks
    finally:
        if pgid is not None:
            for pid in group_members(pgid):
                procs.stop_tree(pid, 5.0)
        shutil.rmtree(ray_dir, ignore_errors=True)
