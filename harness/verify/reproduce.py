"""`benchfarm reproduce RUN`: re-run a stored run exactly, and say whether it came out the same.

Same device (by name, from the inventory), the identical engine binary (by sha256: the recorded
file when it is intact, else rebuilt from the recorded revision and verified), the identical
model (sha256 of its weights verified: model.safetensors, or a sharded checkpoint's index and
shards), the identical prompt ids (from the store) and the identical engine flags
(``config.argv_options`` recorded with the run). The result is compared with the original as
its engine's adapter says (``EngineAdapter.rerun``; lmc: generated tokens and their first divergent
step, perplexity, and one timing's ratio new / original). Nothing is written to the store (the
original run keeps its key).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.store import Store
from devices.boardlock import LockHolder
from devices.connect import connect
from devices.inventory import Inventory
from harness.engines import ENGINES, adapter_of
from harness.engines.base import EngineAdapter, StoredRun
from harness.errors import InputError, RunFailure
from harness.execution.leases import new_holder
from harness.execution.runner import PushMemo, execute, scratch_dir
from harness.identity import model_identity, sha256_file


@dataclass
class Reproduction:
    run_id: int
    device: str
    command: str
    binary_sha256: str
    rebuilt: bool  # the recorded binary was missing or changed: rebuilt and verified
    status: str  # of the new run: ok | failed | lost
    identical: bool | None  # None when the command has no output to compare (attn-bench)
    divergence: str  # where the outputs differ, or ""
    metric: str
    original: float | None
    new: float | None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.original and self.new is not None:
            return self.new / self.original
        return None

    def text(self) -> str:
        same = {True: "identical", False: f"DIFFERENT ({self.divergence})",
                None: "nothing to compare"}[self.identical]
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3f}"
        lines = [f"run {self.run_id} on {self.device} ({self.command}): {self.status}",
                 f"  binary sha256 {self.binary_sha256}"
                 + (" (rebuilt from its revision, verified)" if self.rebuilt else ""),
                 f"  output: {same}",
                 f"  {self.metric}: original {self.original}, now {self.new}, "
                 f"ratio now/original {ratio}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def verified_binary(adapter: EngineAdapter, build: dict[str, Any]) -> tuple[Path, bool]:
    """The recorded binary if intact; else a rebuild of its revision with the same sha256."""
    path = Path(build["binary"])
    if path.is_file() and sha256_file(path) == build["binary_sha256"]:
        return path, False
    record = adapter.rebuild(build)
    if record.binary_sha256 != build["binary_sha256"]:
        raise RunFailure(
            f"the binary of this run (sha256 {build['binary_sha256']}) is gone and rebuilding "
            f"revision {build['revision']} for {build['target']} gives sha256 "
            f"{record.binary_sha256}; the run cannot be reproduced with the identical binary")
    return Path(record.binary), True


def verified_model(model: dict[str, Any] | None) -> str | None:
    if model is None:
        return None
    path = Path(model["path"])
    sha, _ = model_identity(path)
    if sha != model["sha256"]:
        raise RunFailure(f"model {path}: the weights have sha256 {sha}, the run used "
                         f"{model['sha256']}; restore that model to reproduce the run")
    return str(path)


def reproduce(store: Store, run: str, inventory: Inventory,
              timeout_s: float = 900.0) -> Reproduction:
    detail = store.get_run(run)
    row = detail.run
    if row["status"] != "ok":
        raise InputError(f"run {row['id']} is {row['status']}; only ok runs can be reproduced")
    adapter = adapter_of(row["engine"])
    if not adapter.reproducible:
        rerun = " and ".join(name for name, e in ENGINES.items() if e.reproducible)
        raise InputError(f"run {row['id']} ran engine {row['engine']}; reproduce reruns "
                         f"{rerun} runs only (rerun its spec with --force instead)")
    if detail.build is None or (row.get("config") or {}).get("argv_options") is None:
        raise InputError(f"run {row['id']} has no recorded build or engine flags "
                         "(stored by an older coordinator); it cannot be reproduced exactly")
    name = detail.device["name"]
    device = inventory.devices.get(name)
    if device is None:
        raise InputError(f"run {row['id']} ran on device {name!r}, which is not in the "
                         f"inventory (devices: {', '.join(sorted(inventory.devices))})")
    binary, rebuilt = verified_binary(adapter, detail.build)
    ids = None if detail.workload is None else tuple(int(i) for i in detail.workload["ids"])
    rerun = adapter.rerun(StoredRun(row, detail.outcome, binary, detail.build["binary_sha256"],
                                   verified_model(detail.model), ids), timeout_s)
    order = rerun.order
    # the board's lock file names this process as the holder (no job: nothing is stored)
    holder = LockHolder(new_holder(), store.database.url.render_as_string(hide_password=True),
                        None, order.run_key)
    with connect(device) as transport:
        report = execute(order, name, PushMemo(transport), scratch_dir(), holder)
    result = Reproduction(row["id"], name, order.command, order.binary_sha256, rebuilt,
                          report.status, None, "", rerun.metric, rerun.original, None,
                          report.error)
    if report.status == "ok" and report.engine_json is not None:
        result.identical, result.divergence = rerun.same(report.engine_json)
        result.new = rerun.timing(report.engine_json, report.engine_ms)
    return result
