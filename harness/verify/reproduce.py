"""`benchfarm reproduce RUN`: re-run a stored run exactly, and say whether it came out the same.

Same device (by name, from the inventory), the identical engine binary (by sha256: the recorded
file when it is intact, else rebuilt from the recorded revision and verified), the identical
model (sha256 of its weights verified: model.safetensors, or a sharded checkpoint's index and
shards), the identical prompt ids (from the store) and the identical engine flags
(``config.argv_options`` recorded with the run). The result is compared with the original:
generated tokens (first divergent step), perplexity, and the timing ratio new / original.
Nothing is written to the store (the original run keeps its key).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.store import Store
from devices.boardlock import LockHolder
from devices.connect import connect
from devices.inventory import Inventory
from harness.contract import WorkOrder
from harness.engines.lmc import NAME as LMC
from harness.engines.lmc import PREDICTOR_FLAG, WORKTREE
from harness.engines.lmc.build import build_engine
from harness.errors import InputError, RunFailure
from harness.execution.leases import new_holder
from harness.execution.runner import PushMemo, execute, scratch_dir
from harness.identity import Catalogue, model_identity, sha256_file
from reports.runs import first_divergence

# The timing compared per engine command: its name, and its key in the stored run (or outcome)
# and in the engine's JSON (None: the engine process's wall time, measured by the harness).
TIMING = {"generate": ("decode_ms_per_token", "run", "decode_ms_per_token"),
          "ppl": ("engine_ms", "run", None),
          "attn-bench": ("attn_median_ms", "outcome", "ms")}


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


def verified_binary(build: dict[str, Any]) -> tuple[Path, bool]:
    """The recorded binary if intact; else a rebuild of its revision with the same sha256."""
    path = Path(build["binary"])
    if path.is_file() and sha256_file(path) == build["binary_sha256"]:
        return path, False
    revision = str(build["revision"])
    if revision.endswith("+dirty"):
        # A build of uncommitted sources can only come back from the working tree as it is.
        rev = None
    else:
        rev = None if revision == WORKTREE else revision
    record = build_engine(target=build["target"], rev=rev, variant=build["variant"],
                          toolchain_name=build["toolchain"])
    if record.binary_sha256 != build["binary_sha256"]:
        raise RunFailure(
            f"the binary of this run (sha256 {build['binary_sha256']}) is gone and rebuilding "
            f"revision {revision} for {build['target']} gives sha256 {record.binary_sha256}; "
            "the run cannot be reproduced with the identical binary")
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


def verified_predictor(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """gbm's tree file as the run used it (path, sha256), or (None, None) without one."""
    sha = config.get("predictor")
    if sha is None:
        return None, None
    path = Path(config.get("predictor_file") or "")
    if not path.is_file() or sha256_file(path) != sha:
        raise RunFailure(f"predictor {path}: the run used trees with sha256 {sha}, and that "
                         "file is gone or changed; restore it to reproduce the run")
    return str(path), sha


def _compare(command: str, original: dict[str, Any] | None,
             data: dict[str, Any]) -> tuple[bool | None, str]:
    original = original or {}
    if command == "generate":
        before = [int(t) for t in original.get("generated_ids") or []]
        now = [int(t) for t in data.get("tokens", [])]
        step = first_divergence(before, now)
        return step is None, "" if step is None else f"first divergent step {step}"
    if command == "ppl":
        same = original.get("nll") == data.get("nll")
        return same, "" if same else f"nll {original.get('nll')} -> {data.get('nll')}"
    return None, ""


def reproduce(store: Store, run: str, inventory: Inventory,
              timeout_s: float = 900.0) -> Reproduction:
    detail = store.get_run(run)
    row = detail.run
    if row["status"] != "ok":
        raise InputError(f"run {row['id']} is {row['status']}; only ok runs can be reproduced")
    if row.get("engine", LMC) != LMC:
        raise InputError(f"run {row['id']} ran engine {row['engine']}; reproduce reruns lmc "
                         "runs only (rerun its spec with --force instead)")
    options = (row.get("config") or {}).get("argv_options")
    if detail.build is None or options is None:
        raise InputError(f"run {row['id']} has no recorded build or engine flags "
                         "(stored by an older coordinator); it cannot be reproduced exactly")
    name = detail.device["name"]
    device = inventory.devices.get(name)
    if device is None:
        raise InputError(f"run {row['id']} ran on device {name!r}, which is not in the "
                         f"inventory (devices: {', '.join(sorted(inventory.devices))})")
    binary, rebuilt = verified_binary(detail.build)
    model_dir = verified_model(detail.model)
    predictor, predictor_sha = verified_predictor(row.get("config") or {})
    command = row["command"]
    ids = None
    if command != "attn-bench" and detail.workload is not None:
        ids = tuple(int(i) for i in detail.workload["ids"])
    order = WorkOrder(run_key=f"{row['run_key']}-reproduce", label=f"reproduce run {row['id']}",
                      engine=LMC, command=command, binary=str(binary),
                      binary_sha256=detail.build["binary_sha256"], model_dir=model_dir,
                      model_sha256=model_dir and Catalogue.empty().add_tree(Path(model_dir)),
                      ids=ids, options=tuple(options), timeout_s=timeout_s,
                      extra_file=predictor, extra_sha256=predictor_sha,
                      extra_flag=PREDICTOR_FLAG if predictor else None)
    # the board's lock file names this process as the holder (no job: nothing is stored)
    holder = LockHolder(new_holder(), store.engine.url.render_as_string(hide_password=True),
                        None, order.run_key)
    with connect(device) as transport:
        report = execute(order, name, PushMemo(transport), scratch_dir(), holder)
    metric, stored_in, engine_key = TIMING[command]
    original = (row if stored_in == "run" else detail.outcome or {}).get(metric)
    result = Reproduction(row["id"], name, command, detail.build["binary_sha256"], rebuilt,
                          report.status, None, "", metric, original, None, report.error)
    if report.status == "ok" and report.engine_json is not None:
        data = report.engine_json
        result.identical, result.divergence = _compare(command, detail.outcome, data)
        result.new = report.engine_ms if engine_key is None else data.get(engine_key)
    return result
