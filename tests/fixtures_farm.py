"""Fixtures for the device farm: a real local farm of sshd nodes, and tiny test programs.

``farm`` (session scope) brings the farm up in a temporary directory and down at the end; its
nodes are ``farm.x86`` (x86_64) and ``farm.arm`` (aarch64 under qemu). Tests that break a
node (kill sshd, swap keys) start their own farm with ``start_farm(tmp_path)`` instead.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devices.boardlock import LOCK_FILE, holder_record
from devices.farm import farm_down, farm_up
from devices.inventory import Device, Inventory, load_inventory

# Prints its arguments one per line in brackets, so a test can see exactly what argv arrived;
# `info` prints an lmc-style JSON document, so `devices check` can run it as a stand-in engine.
ARGS_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#if defined(__aarch64__)
#define ARCH "aarch64"
#else
#define ARCH "x86_64"
#endif
int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "info") == 0) {
    printf("{\"schema\": \"lmc.info/1\", \"command\": \"info\", \"version\": \"test\", "
           "\"arch\": \"%s\", \"simd\": []}\n", ARCH);
    return 0;
  }
  printf("arch=%s\n", ARCH);
  for (int i = 1; i < argc; i++) printf("[%s]\n", argv[i]);
  return 0;
}
"""
COMPILERS = {"x86_64": ["gcc"], "aarch64": ["aarch64-linux-gnu-gcc", "-static"]}


@dataclass
class Farm:
    state_dir: Path
    inventory_path: Path
    inventory: Inventory

    @property
    def x86(self) -> Device:
        return self.inventory.get("farm-x86")

    @property
    def arm(self) -> Device:
        return self.inventory.get("farm-arm")


def start_farm(state_dir: Path) -> Farm:
    """A farm whose nodes end with the test session, however it ends."""
    inventory_path = farm_up(state_dir, with_caller=True)
    return Farm(state_dir, inventory_path, load_inventory(inventory_path))


@pytest.fixture(scope="session")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    state_dir = tmp_path_factory.mktemp("farm")
    try:
        yield start_farm(state_dir)
    finally:
        farm_down(state_dir)


@pytest.fixture(scope="session")
def args_program(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The argv-echoing program built for each arch: {"x86_64": path, "aarch64": path}."""
    out = tmp_path_factory.mktemp("args_program")
    source = out / "args.c"
    source.write_text(ARGS_PROGRAM)
    binaries = {}
    for arch, cc in COMPILERS.items():
        binary = out / f"args-{arch}"
        subprocess.run([*cc, "-O1", "-o", str(binary), str(source)], check=True, timeout=120)
        binaries[arch] = binary
    return binaries


def old_file(path: Path, size: int, days: float = 2.0) -> Path:
    """A file of ``size`` bytes last modified ``days`` ago (an artifact for `gc` to age out)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    moment = time.time() - days * 86400
    os.utime(path, (moment, moment))
    return path


def processes_with_arg(arg: str) -> list[int]:
    """Live (not zombie) processes with ``arg`` as one of their arguments."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if arg.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def gone(arg: str, within_s: float = 10.0) -> bool:
    """Whether every process with ``arg`` among its arguments is gone within ``within_s``."""
    deadline = time.monotonic() + within_s
    while processes_with_arg(arg) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not processes_with_arg(arg)


def session_of(workdir: Path) -> str:
    """The session recorded in the workdir's lock file (devices.boardlock), once a holder
    wrote it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        path = workdir / LOCK_FILE
        record = holder_record(path.read_text()) if path.exists() else {}
        if record.get("sid"):
            return record["sid"]
        time.sleep(0.05)
    raise AssertionError("no holder was recorded")


def session_members(sid: str) -> list[int]:
    """The live processes of session ``sid`` (a board's run: the farm's boards are here)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[3] == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
