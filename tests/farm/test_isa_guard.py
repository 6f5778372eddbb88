"""The runner's last check before it starts a binary: a work order whose instruction-set level
needs a CPU feature the board lacks fails with the features named, and the binary never runs
(a board whose features were not known when the run was planned reaches this check)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from devices import isa
from devices.boardlock import LockHolder
from devices.connect import connect
from devices.inventory import Device
from harness.contract import WorkOrder
from harness.execution.runner import PushMemo, execute


def test_a_binary_is_not_started_on_a_board_without_its_features(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    binary = tmp_path / "engine.sh"  # stands for the engine: it leaves a mark when it starts
    binary.write_text(f"#!/bin/sh\ntouch {marker}\n")
    binary.chmod(0o755)
    board = Device(name="here", arch="x86_64", cls="x86", transport="local",
                   workdir=str(tmp_path / "work"))
    lacking = sorted(isa.level("armv8-a").features - isa.host_features())
    assert lacking  # this machine has no NEON: the level below needs what it lacks
    order = WorkOrder(run_key="k" * 64, label="guard", engine="lmc", command="info",
                      binary=str(binary),
                      binary_sha256=hashlib.sha256(binary.read_bytes()).hexdigest(),
                      model_dir=None, model_sha256=None, ids=None, options=(), timeout_s=30.0,
                      warmup=True, isa_features=tuple(sorted(isa.level("armv8-a").features)))
    holder = LockHolder("test:1:x", "sqlite:///none", None, order.run_key)
    with connect(board) as transport:
        report = execute(order, board.name, PushMemo(transport), tmp_path, holder)
        assert report.status == "failed" and not marker.exists()
        assert f"lacks {', '.join(lacking)}" in report.error and "not started" in report.error
        # the same order for a level this machine has starts the binary
        runnable = WorkOrder(**{**order.__dict__, "isa_features": ("sse4_2",)})
        execute(runnable, board.name, PushMemo(transport), tmp_path, holder)
    assert marker.exists()
